"""Shared mappings of the guest's own files: stores reach the file on munmap and msync (mm/msync.c),
and a forked child's copies of the mappings write back too."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import PAGE_SIZE
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import OpenFile
from emu.kernel.fs.layer import overlay
from emu.kernel.overlay import SharedMap
from emu.kernel.overlay_files import OverlayFile

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


MS_ASYNC, MS_INVALIDATE, MS_SYNC = 1, 2, 4


def mapped(k: Kernel, file: OpenFile, start: int, offset: int, length: int, shared: bool) -> None:
    """mmap of an overlay file: a shared mapping writes back to it (and sees its writes)."""
    if shared and isinstance(file, OverlayFile):
        file.mapped_in(k.mem, start, offset, length)
        ov = overlay(k)
        if ov is not None:
            ov.mapped.add(file.inode)


def fork_maps(parent: Kernel, child: Kernel) -> None:
    """fork: the child's copies of the parent's shared file mappings write back to their files too."""
    ov = overlay(parent)
    for inode in list(ov.mapped) if ov is not None else []:
        inode.maps += [SharedMap(child.mem, m.start, m.offset, m.length) for m in inode.maps if m.mem is parent.mem]


def write_back(k: Kernel, addr: int, length: int) -> None:
    """The guest's stores through shared mappings of [addr, addr+length) reach their files
    (before munmap, and on msync)."""
    ov = overlay(k)
    if ov is None or not ov.mapped:
        return
    for inode in list(ov.mapped):
        inode.release_maps(k.mem, addr, addr + length)


def sys_msync(k: Kernel, addr: int, length: int, flags: int, *_: int) -> int:
    if addr % PAGE_SIZE or flags & ~(MS_ASYNC | MS_INVALIDATE | MS_SYNC) or (
            flags & MS_ASYNC and flags & MS_SYNC):
        raise SyscallError(errno.EINVAL)
    length = abi.page_up(length)
    covered = sum(min(v.end, addr + length) - max(v.start, addr) for v in k.mem.overlapping(addr, addr + length))
    if covered < length:
        raise SyscallError(errno.ENOMEM)
    write_back(k, addr, length)
    return 0
