"""perf_event_open for the uprobe PMU, as programs that probe themselves use it.

attr.type = UPROBE_PMU_TYPE; config1 = path, config2 = file offset; config bit 0 = return
probe; config bits 32-63 = ref_ctr_offset (a USDT semaphore). The fd supports read() of the
hit count, the ENABLE / DISABLE / RESET ioctls, close() (detaches), and an mmap'ed ring buffer
receiving PERF_RECORD_SAMPLE records with PERF_SAMPLE_IP and PERF_SAMPLE_REGS_USER.
As on Linux 6.18 here: DISABLE leaves the probe installed (hits still run the trampoline and
are not counted); the trampoline page stays after close (docs/linux-6.18-observed.md section 8).

An event follows the process it was opened for (pid 0 or its own pid), and the children forked
after it only with attr.inherit: a hit in any other process is not counted and takes the
breakpoint out of that process (uprobe_perf_filter; the notes' fork_while_int3). A child's hits
count in its own inherited event, which the opener does not read.
"""

from __future__ import annotations

import errno
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.files import OpenFile, StatInfo, synthetic_stat
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.state import PerfAttach
from emu.kernel.sysfs import UPROBE_PMU_TYPE
from emu.kernel.uprobes.consumers import Consumer, Hit

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

PERF_ATTR_SIZE_VER0 = 64
IOC_ENABLE, IOC_DISABLE, IOC_RESET = 0x2400, 0x2401, 0x2403
SAMPLE_IP, SAMPLE_REGS_USER = 1 << 0, 1 << 12
SUPPORTED_SAMPLES = SAMPLE_IP | SAMPLE_REGS_USER
RECORD_SAMPLE, MISC_USER, REGS_ABI_64 = 9, 2, 2
FLAG_DISABLED = 1 << 0
FLAG_INHERIT = 1 << 1
PAGE = 4096
DATA_HEAD, DATA_TAIL, DATA_OFFSET, DATA_SIZE = 1024, 1032, 1040, 1048
# PERF_REG_X86_* order: ax bx cx dx si di bp sp ip flags cs ss ds es fs gs r8..r15
PERF_REGS = ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip", "flags", "cs", "ss", None, None, None, None,
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")




@dataclass(frozen=True, slots=True)
class PerfAttr:
    type: int
    config: int
    sample_period: int
    sample_type: int
    flags: int
    path_ptr: int
    offset: int
    sample_regs_user: int

    @classmethod
    def parse(cls, raw: bytes) -> PerfAttr:
        type_, _size, config, period, sample_type, _read_format, flags = struct.unpack_from("<IIQQQQQ", raw)
        path_ptr, offset = struct.unpack_from("<QQ", raw, 56)
        regs = struct.unpack_from("<Q", raw, 80)[0] if len(raw) >= 88 else 0
        return cls(type_, config, period, sample_type, flags, path_ptr, offset, regs)


class PerfEvent(OpenFile):
    """One uprobe perf event: a consumer of the probe plus its counter and ring buffer."""

    shared_writable = True

    def __init__(self, k: Kernel, attr: PerfAttr, path: str, attach: PerfAttach) -> None:
        self.k = k
        self.attr = attr
        self.guest_path = "anon_inode:[perf_event]"
        self.count = 0
        self.ring: tuple[int, int] | None = None
        retprobe = bool(attr.config & 1)
        record = self._hit
        self.pids = {k.ident.pid}  # the target, and with inherit the children forked since
        self.consumer = Consumer(handler=None if retprobe else record, ret_handler=record if retprobe else None,
                                 filter=self.pids.__contains__)
        self.consumer.enabled = not attr.flags & FLAG_DISABLED
        self.detach = attach(path, attr.offset, retprobe, attr.config >> 32, self.consumer)

    # ------------------------------------------------------------------ hits
    def inherit(self, child_pid: int) -> None:
        """fork: with attr.inherit the child gets an event of its own (perf_event_init_task)."""
        if self.attr.flags & FLAG_INHERIT and self.k.ident.pid in self.pids:
            self.pids.add(child_pid)

    def _hit(self, hit: Hit) -> None:
        if hit.mem is not self.k.mem:
            return  # a child's hit: counted in the child's inherited event
        self.count += 1
        if self.attr.sample_period and self.ring is not None:
            self._sample(hit)

    def _sample(self, hit: Hit) -> None:
        body = b""
        if self.attr.sample_type & SAMPLE_IP:
            body += struct.pack("<Q", hit.regs.ip)
        if self.attr.sample_type & SAMPLE_REGS_USER:
            words = [REGS_ABI_64] + [
                getattr(hit.regs, name) if name else 0
                for bit, name in enumerate(PERF_REGS) if self.attr.sample_regs_user >> bit & 1
            ]
            body += struct.pack(f"<{len(words)}Q", *words)
        self._emit(struct.pack("<IHH", RECORD_SAMPLE, MISC_USER, 8 + len(body)) + body)

    def _emit(self, record: bytes) -> None:
        assert self.ring is not None
        start, length = self.ring
        mem = self.k.mem
        head, tail = struct.unpack("<QQ", mem.read(start + DATA_HEAD, 16))
        size = length - PAGE
        if head - tail + len(record) > size:
            return  # the reader is behind: the kernel drops the record
        pos = head % size
        first = min(len(record), size - pos)
        mem.write(start + PAGE + pos, record[:first])
        if first < len(record):
            mem.write(start + PAGE, record[first:])
        mem.write(start + DATA_HEAD, struct.pack("<Q", head + len(record)))

    # ------------------------------------------------------------- file ops
    def read(self, size: int) -> bytes:
        if size < 8:
            raise SyscallError(errno.ENOSPC)
        return struct.pack("<Q", self.count)

    def ioctl(self, request: int, arg: int) -> int | None:
        if request == IOC_ENABLE:
            self.consumer.enabled = True
        elif request == IOC_DISABLE:
            self.consumer.enabled = False  # the probe stays installed (observed on 6.18)
        elif request == IOC_RESET:
            self.count = 0
        else:
            return None
        return 0

    def mmap_bytes(self, offset: int, length: int) -> bytes:
        data_pages = length // PAGE - 1
        if offset or length % PAGE or data_pages < 1 or data_pages & (data_pages - 1):
            raise SyscallError(errno.EINVAL)  # 1 + 2^n pages, from offset 0
        head = bytearray(PAGE)
        struct.pack_into("<QQ", head, DATA_OFFSET, PAGE, length - PAGE)
        return bytes(head)

    def mapped(self, start: int, length: int) -> None:
        self.ring = (start, length)

    def stat(self) -> StatInfo:
        return synthetic_stat(stat.S_IFREG | 0o600)

    def close(self) -> None:
        self.detach()


def sys_perf_event_open(k: Kernel, attr_ptr: int, pid: int, cpu: int, group_fd: int, flags: int, *_: int) -> int:
    size = struct.unpack("<I", k.mem.read_user(attr_ptr + 4, 4))[0] or PERF_ATTR_SIZE_VER0
    attr = PerfAttr.parse(k.mem.read_user(attr_ptr, max(PERF_ATTR_SIZE_VER0, min(size, 136))))
    if attr.type != UPROBE_PMU_TYPE:
        raise SyscallError(errno.ENOENT)  # no other PMU is emulated
    pid = pid - (1 << 64) if pid >= 1 << 63 else pid
    if pid not in (0, -1, k.ident.pid):
        raise SyscallError(errno.ESRCH)
    if attr.sample_type & ~SUPPORTED_SAMPLES:
        raise SyscallError(errno.EINVAL)
    if k.perf_attach is None:
        raise SyscallError(errno.ENODEV)
    path = k.mem.read_cstring(attr.path_ptr, 4096).decode("utf-8", "surrogateescape")
    event = PerfEvent(k, attr, path, k.perf_attach)
    if pid == -1:
        event.consumer.filter = None  # every process (with a cpu given, as Linux requires)
    return k.files.install(FdEntry(event, 2, bool(flags & 8)))  # PERF_FLAG_FD_CLOEXEC


def inherit_events(files: Mapping[int, object], child_pid: int) -> None:
    """Tell each perf event among a forked child's descriptors about the child."""
    for entry in files.values():
        event = getattr(entry, "file", None)
        if isinstance(event, PerfEvent):
            event.inherit(child_pid)
