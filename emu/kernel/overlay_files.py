"""Open descriptions of the guest's layer: a file kept in memory (OverlayFile), and a host file
opened read-only that reads the guest's bytes once the guest has written the file (LowerFile).
The layer's tree: overlay.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.files import HostFile, OpenFile, StatInfo
from emu.kernel.overlay import Inode, SharedMap
from emu.process.vma import SharedPages

if TYPE_CHECKING:
    from emu.process.memory import Memory


class OverlayFile(OpenFile):
    """An open description of a regular file in the guest's layer (offset shared by dup'ed fds)."""

    def __init__(self, inode: Inode, guest_path: str, writable: bool, now_ns: Callable[[], int]) -> None:
        self.inode = inode
        self.guest_path = guest_path
        self.writable = writable
        self.now_ns = now_ns
        self.pos = 0

    seekable_end = True

    @property
    def shared_writable(self) -> bool:  # type: ignore[override]
        return self.writable

    def read(self, size: int) -> bytes:
        chunk = self.pread(size, self.pos)
        self.pos += len(chunk)
        return chunk

    def pread(self, size: int, offset: int) -> bytes:
        return bytes(self.inode.data[offset : offset + size])

    def write(self, data: bytes) -> int:
        n = self.pwrite(data, self.pos)
        self.pos += n
        return n

    def pwrite(self, data: bytes, offset: int) -> int:
        buf = self.inode.data
        if offset > len(buf):
            buf.extend(bytes(offset - len(buf)))
        buf[offset : offset + len(data)] = data
        self.inode.push(offset, offset + len(data))
        self.inode.mtime_ns = self.inode.ctime_ns = self.now_ns()
        return len(data)

    def truncate(self, length: int) -> None:
        buf = self.inode.data
        if length < len(buf):
            del buf[length:]
        else:
            buf.extend(bytes(length - len(buf)))
        self.inode.push(0, length)
        self.inode.mtime_ns = self.inode.ctime_ns = self.now_ns()

    def seek(self, offset: int, whence: int) -> int:
        size = len(self.inode.data)
        if whence == os.SEEK_DATA:
            if offset >= size:
                raise SyscallError(errno.ENXIO)
            target = offset
        elif whence == os.SEEK_HOLE:
            if offset >= size:
                raise SyscallError(errno.ENXIO)
            target = size
        else:
            base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: size}.get(whence)
            if base is None:
                raise SyscallError(errno.EINVAL)
            target = base + offset
        if target < 0:
            raise SyscallError(errno.EINVAL)
        self.pos = target
        return target

    def size_left(self) -> int:
        return max(0, len(self.inode.data) - self.pos)

    def stat(self) -> StatInfo:
        return self.inode.stat()

    def mmap_bytes(self, offset: int, length: int) -> bytes:
        return bytes(self.inode.data[offset : offset + length])

    def shared_pages(self, offset: int, length: int) -> tuple[SharedPages, int]:
        return self.inode.shared_pages(offset, length)

    def mapped_in(self, mem: Memory, start: int, offset: int, length: int) -> None:
        self.inode.data  # noqa: B018 - a mapping needs the bytes in memory
        self.inode.maps.append(SharedMap(mem, start, offset, length))


class LowerFile(HostFile):
    """A host regular file opened read-only while the guest's layer is on: once the guest writes
    the file (copying it up), this descriptor reads the guest's bytes too, from where it was."""

    def __init__(self, host_path: str, guest_path: str, copied: dict[tuple[int, int], Inode]) -> None:
        super().__init__(host_path, guest_path, False)
        st = os.fstat(self.fd)
        self.key = (st.st_dev, st.st_ino)
        self.copied = copied
        self._upper: OverlayFile | None = None

    def upper(self) -> OverlayFile | None:
        if self._upper is None and self.key in self.copied:
            self._upper = OverlayFile(self.copied[self.key], self.guest_path, False, lambda: 0)
            self._upper.pos = os.lseek(self.fd, 0, os.SEEK_CUR)
        return self._upper

    def host_is_current(self) -> bool:
        return self.upper() is None

    def read(self, size: int) -> bytes:
        up = self.upper()
        return up.read(size) if up is not None else super().read(size)

    def pread(self, size: int, offset: int) -> bytes:
        up = self.upper()
        return up.pread(size, offset) if up is not None else super().pread(size, offset)

    def seek(self, offset: int, whence: int) -> int:
        up = self.upper()
        return up.seek(offset, whence) if up is not None else super().seek(offset, whence)

    def size_left(self) -> int:
        up = self.upper()
        return up.size_left() if up is not None else super().size_left()

    def stat(self) -> StatInfo:
        up = self.upper()
        return up.stat() if up is not None else super().stat()

    def mmap_bytes(self, offset: int, length: int) -> bytes:
        up = self.upper()
        return up.mmap_bytes(offset, length) if up is not None else super().mmap_bytes(offset, length)
