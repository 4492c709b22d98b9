"""The descriptor table of a process (fs/file.c): descriptor -> open file, its flags, close-on-exec."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.files import OpenFile

if TYPE_CHECKING:
    pass


MAX_FDS = 1024


@dataclass
class FdEntry:
    file: OpenFile
    flags: int
    cloexec: bool


class FdTable:
    def __init__(self) -> None:
        self.entries: dict[int, FdEntry] = {}

    def get(self, fd: int) -> FdEntry:
        entry = self.entries.get(fd)
        if entry is None:
            raise SyscallError(errno.EBADF)
        return entry

    def file(self, fd: int) -> OpenFile:
        return self.get(fd).file

    def install(self, entry: FdEntry, lowest: int = 0) -> int:
        fd = lowest
        while fd in self.entries:
            fd += 1
        if fd >= MAX_FDS:
            raise SyscallError(errno.EMFILE)
        self.entries[fd] = entry
        return fd

    def put(self, fd: int, entry: FdEntry) -> None:
        if not 0 <= fd < MAX_FDS:
            raise SyscallError(errno.EBADF)
        if fd in self.entries:
            self.close(fd)
        self.entries[fd] = entry

    def close(self, fd: int) -> None:
        entry = self.entries.pop(fd, None)
        if entry is None:
            raise SyscallError(errno.EBADF)
        if not any(e.file is entry.file for e in self.entries.values()):
            entry.file.close()

    def close_all(self) -> None:
        for fd in list(self.entries):
            self.close(fd)
