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


class SharedFdTable(FdTable):
    """An fd table whose open files may also be held by other processes' tables (after fork)."""

    def __init__(self, holders: dict[int, int] | None = None) -> None:
        super().__init__()
        self.holders = holders if holders is not None else {}  # id(file) -> tables holding it, if > 1

    def close(self, fd: int) -> None:
        entry = self.entries.pop(fd, None)
        if entry is None:
            raise SyscallError(errno.EBADF)
        file = entry.file
        if any(e.file is file for e in self.entries.values()):
            return
        others = self.holders.get(id(file), 1) - 1
        if others > 0:
            self.holders[id(file)] = others
            return
        self.holders.pop(id(file), None)
        file.close()

    def fork(self) -> SharedFdTable:
        child = SharedFdTable(self.holders)
        child.entries = {fd: FdEntry(e.file, e.flags, e.cloexec) for fd, e in self.entries.items()}
        for file in {id(e.file): e.file for e in self.entries.values()}:
            self.holders[file] = self.holders.get(file, 1) + 1
        return child

    def close_on_exec(self) -> None:
        for fd in [fd for fd, e in self.entries.items() if e.cloexec]:
            self.close(fd)
