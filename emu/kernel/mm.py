"""Memory syscalls: mmap, munmap, mprotect, mremap, madvise, brk, mseal.

Sealed VMAs (mseal, Linux 6.10+) refuse munmap, mprotect, mremap and a MAP_FIXED mapping over them
with EPERM; the kernel's own special mappings (emu.process.memory.SPECIAL) refuse growing (EFAULT), moving
where their vm_special_mapping says so (EPERM) and an mprotect beyond their VM_MAY* bits (EACCES).
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import PAGE_SIZE, TASK_SIZE, Prot, page_up
from emu.errors import MapFailed
from emu.kernel import limits
from emu.kernel.errno_ import SyscallError
from emu.kernel.fs.mapped import mapped, write_back
from emu.process.memory import SPECIAL
from emu.process.vma import SharedPages

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.kernel.files import OpenFile

PROT_MASK = 0x7
MADV_DONTNEED = 4
MADV_FREE = 8
MAP_TYPE = 0x0F


def _prot(prot: int) -> Prot:
    if prot & ~(PROT_MASK | 0x01000000 | 0x02000000):  # PROT_GROWSDOWN/UP tolerated
        raise SyscallError(errno.EINVAL)
    return Prot(prot & PROT_MASK)


def _fd(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _refuse_sealed(k: Kernel, start: int, end: int) -> None:
    """can_modify_mm: an operation that would change a sealed VMA fails whole, before it starts."""
    if k.mem.sealed_in(start, end):
        raise SyscallError(errno.EPERM)


def _place(k: Kernel, addr: int, length: int, flags: int) -> int:
    if flags & abi.MAP_FIXED:
        if addr % PAGE_SIZE or addr + length > TASK_SIZE or addr == 0:
            raise SyscallError(errno.EINVAL if addr % PAGE_SIZE else errno.ENOMEM)
        _refuse_sealed(k, addr, addr + length)
        return addr
    if flags & abi.MAP_FIXED_NOREPLACE:
        if addr % PAGE_SIZE:
            raise SyscallError(errno.EINVAL)
        if not k.mem.is_free(addr, addr + length):
            raise SyscallError(errno.EEXIST)
        return addr
    hint = page_up(addr) if addr else 0
    if hint and hint + length <= TASK_SIZE and k.mem.is_free(hint, hint + length):
        return hint
    found = k.mem.find_free(length)
    if found is None:
        raise SyscallError(errno.ENOMEM)
    return found


def sys_mmap(k: Kernel, addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    if length == 0 or offset % PAGE_SIZE:
        raise SyscallError(errno.EINVAL)
    kind = flags & MAP_TYPE
    if kind not in (abi.MAP_PRIVATE, abi.MAP_SHARED, 0x03):
        raise SyscallError(errno.EINVAL)
    length = page_up(length)
    if length > TASK_SIZE:
        raise SyscallError(errno.ENOMEM)
    protection = _prot(prot)
    data = b""
    file_args: dict[str, object] = {}
    backing = (SharedPages(length), 0) if kind == abi.MAP_SHARED and flags & abi.MAP_ANONYMOUS else None
    if not flags & abi.MAP_ANONYMOUS:
        entry = k.files.get(_fd(fd))
        if kind != abi.MAP_PRIVATE and protection & Prot.WRITE and not entry.file.shared_writable:
            raise SyscallError(errno.EACCES)  # the sandbox only opens files read-only
        data = entry.file.mmap_bytes(offset, length)
        if kind == abi.MAP_SHARED:
            backing = entry.file.shared_pages(offset, length)
        st = entry.file.stat()
        file_args = dict(name=entry.file.guest_path, offset=offset, dev=(os.major(st.dev), os.minor(st.dev)),
                         inode=st.ino)
    start = _place(k, addr, length, flags)
    replaced = sum(min(v.end, start + length) - max(v.start, start) for v in k.mem.overlapping(start, start + length))
    limits.charge_memory(k, length - replaced)
    vma = k.mem.map(start, length, protection, shared=kind == abi.MAP_SHARED, data=data,
                     backing=backing, **file_args)  # type: ignore[arg-type]
    if not flags & abi.MAP_ANONYMOUS:
        entry.file.mapped(start, length)
        if kind == abi.MAP_SHARED:
            _shared_file_mapping(k, entry.file, start, offset, length, entry.flags)
    if vma.inode and protection & Prot.EXEC:
        for observer in k.exec_mmap_observers:  # uprobe_mmap: install probes on a newly mapped text
            observer(vma)
    return start


def _shared_file_mapping(k: Kernel, file: OpenFile, start: int, offset: int, length: int, fd_flags: int) -> None:
    """Remember a MAP_SHARED file mapping: the guest's layer writes it back; one of a read-only
    descriptor may never become writable (no VM_MAYWRITE: mprotect says EACCES)."""
    mapped(k, file, start, offset, length, shared=True)
    if fd_flags & abi.O_ACCMODE == abi.O_RDONLY:
        k.shared_readonly.append((start, start + length, file.stat().ino))


def _write_back(k: Kernel, addr: int, length: int) -> None:
    overlay = k.vfs.overlay
    if overlay is not None and overlay.mapped:
        write_back(k, addr, length)


def sys_munmap(k: Kernel, addr: int, length: int, *_: int) -> int:
    if addr % PAGE_SIZE or length == 0 or addr + length > TASK_SIZE:
        raise SyscallError(errno.EINVAL)
    _refuse_sealed(k, addr, addr + length)
    _write_back(k, addr, length)
    k.mem.unmap(addr, length)
    return 0


def sys_mprotect(k: Kernel, addr: int, length: int, prot: int, *_: int) -> int:
    if addr % PAGE_SIZE:
        raise SyscallError(errno.EINVAL)
    protection = _prot(prot)
    if length == 0:
        return 0
    end = page_up(addr + length)
    _refuse_sealed(k, addr, end)
    if protection & Prot.WRITE and _maps_readonly_shared(k, addr, end):
        raise SyscallError(errno.EACCES)
    for vma in k.mem.overlapping(addr, end):
        special = SPECIAL.get(vma.name)
        if special is not None and protection & ~special.may:
            raise SyscallError(errno.EACCES)  # asks for a right the mapping may never have
    if not k.mem.protect(addr, length, protection):
        raise SyscallError(errno.ENOMEM)
    return 0


def _maps_readonly_shared(k: Kernel, lo: int, hi: int) -> bool:
    """Is part of [lo, hi) a MAP_SHARED mapping of a descriptor opened read-only (still in place)?"""
    if not k.shared_readonly:
        return False
    live = [(a, b, ino) for a, b, ino in k.shared_readonly
            if (vma := k.mem.find(a)) is not None and vma.shared and vma.inode == ino]
    k.shared_readonly = live
    return any(a < hi and lo < b for a, b, _ in live)


def sys_mremap(k: Kernel, old: int, old_size: int, new_size: int, flags: int, new_addr: int, *_: int) -> int:
    if old % PAGE_SIZE or flags & ~7 or new_size == 0:
        raise SyscallError(errno.EINVAL)
    if flags & abi.MREMAP_FIXED and not flags & abi.MREMAP_MAYMOVE:
        raise SyscallError(errno.EINVAL)
    old_size, new_size = page_up(old_size), page_up(new_size)
    vma = k.mem.find(old)
    if vma is None or old + old_size > vma.end:
        raise SyscallError(errno.EFAULT)
    _refuse_sealed(k, old, old + old_size)
    special = SPECIAL.get(vma.name)
    if special is not None:
        if new_size > old_size:
            raise SyscallError(errno.EFAULT)  # VM_DONTEXPAND
        if not special.movable and (flags & abi.MREMAP_FIXED or new_size != old_size):
            raise SyscallError(errno.EPERM)
    if flags & abi.MREMAP_FIXED:
        _refuse_sealed(k, new_addr, new_addr + new_size)
    if new_size <= old_size and not flags & abi.MREMAP_FIXED:
        if new_size < old_size:
            k.mem.unmap(old + new_size, old_size - new_size)
        return old
    limits.charge_memory(k, new_size - old_size)
    if not flags & abi.MREMAP_FIXED and k.mem.is_free(old + old_size, old + new_size):
        k.mem.map(old + old_size, new_size - old_size, vma.prot, name=vma.name, dev=vma.dev, inode=vma.inode,
                  offset=vma.offset + (old + old_size - vma.start) if vma.inode else 0, shared=vma.shared)
        return old
    if not flags & abi.MREMAP_MAYMOVE:
        raise SyscallError(errno.ENOMEM)
    content = k.mem.read(old, old_size)
    if flags & abi.MREMAP_FIXED:
        if new_addr % PAGE_SIZE:
            raise SyscallError(errno.EINVAL)
        target = new_addr
    else:
        found = k.mem.find_free(new_size)
        if found is None:
            raise SyscallError(errno.ENOMEM)
        target = found
    k.mem.map(target, new_size, vma.prot, name=vma.name, dev=vma.dev, inode=vma.inode,
              offset=vma.offset + (old - vma.start) if vma.inode else 0, shared=vma.shared, data=content)
    if not flags & abi.MREMAP_DONTUNMAP:
        k.mem.unmap(old, old_size)
    return target


def sys_madvise(k: Kernel, addr: int, length: int, advice: int, *_: int) -> int:
    if addr % PAGE_SIZE:
        raise SyscallError(errno.EINVAL)
    length = page_up(length)
    if advice in (MADV_DONTNEED, MADV_FREE):
        if any(v.sealed and not v.inode and not v.prot & Prot.WRITE for v in k.mem.overlapping(addr, addr + length)):
            raise SyscallError(errno.EPERM)  # discarding a sealed read-only anonymous mapping would change it
        # Private anonymous pages read back as zeros afterwards (file pages would refault from the file).
        for vma in k.mem.overlapping(addr, addr + length):
            if not vma.inode and not vma.shared:
                lo, hi = max(vma.start, addr), min(vma.end, addr + length)
                k.mem.write(lo, bytes(hi - lo))
    return 0


def sys_brk(k: Kernel, addr: int, *_: int) -> int:
    """Linux returns the current break on any failure; the new one on success."""
    brk = k.brk
    if addr < brk.start:
        return brk.current
    old_top, new_top = page_up(brk.current), page_up(addr)
    if new_top > old_top:
        if not k.mem.is_free(old_top, new_top):
            return brk.current
        try:
            limits.charge_memory(k, new_top - old_top)
        except SyscallError:
            return brk.current
        try:
            k.mem.map(old_top, new_top - old_top, Prot.READ | Prot.WRITE, name="[heap]")
        except MapFailed:
            return brk.current
    elif new_top < old_top:
        k.mem.unmap(new_top, old_top - new_top)
    brk.current = addr
    return addr


def sys_mseal(k: Kernel, start: int, length: int, flags: int, *_: int) -> int:
    """mseal(2) as mm/mseal.c checks it: flags must be 0, start page-aligned, the rounded range must
    not wrap (EINVAL) and must be mapped without a hole (ENOMEM); sealing again is not an error."""
    if flags or start % PAGE_SIZE:
        raise SyscallError(errno.EINVAL)
    rounded = page_up(length)
    if rounded >= 1 << 64:
        raise SyscallError(errno.ENOMEM)
    end = start + rounded
    if end >= 1 << 64:
        raise SyscallError(errno.EINVAL)
    if end == start:
        return 0
    covered = sum(min(v.end, end) - max(v.start, start) for v in k.mem.overlapping(start, end))
    if covered != end - start:
        raise SyscallError(errno.ENOMEM)
    k.mem.seal(start, end)
    return 0
