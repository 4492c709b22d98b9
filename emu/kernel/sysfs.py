"""The few /sys files the guest may ask about: the uprobe PMU's type and config format.

Served by the fake kernel whatever the root (the host's /sys would describe the host's PMU
numbering, which the guest's perf_event_open here does not share by accident)."""

from __future__ import annotations

import errno
import posixpath
import stat

from emu import abi
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import MemFile, OpenFile, StatInfo, synthetic_stat

UPROBE_PMU_TYPE = 8  # what this machine's kernel numbers the uprobe PMU (notes: "uprobe PMU type 8"); perf.py checks it
PMU_DIR = "/sys/bus/event_source/devices/uprobe"
FILES = {
    f"{PMU_DIR}/type": f"{UPROBE_PMU_TYPE}\n".encode(),
    f"{PMU_DIR}/format/retprobe": b"config:0\n",
    f"{PMU_DIR}/format/ref_ctr_offset": b"config:32-63\n",
}
DIRS = frozenset({PMU_DIR, f"{PMU_DIR}/format"})


def normalize(path: str) -> str:
    return posixpath.normpath(path)


def serves(path: str) -> bool:
    norm = normalize(path)
    return norm in FILES or norm in DIRS


def open_file(guest: str, flags: int) -> OpenFile | None:
    if guest in DIRS:
        raise SyscallError(errno.EISDIR if flags & abi.O_ACCMODE else errno.EACCES)
    content = FILES.get(guest)
    if content is None:
        return None
    if flags & abi.O_ACCMODE:
        raise SyscallError(errno.EACCES)
    return MemFile(guest, content)


def stat_of(guest: str) -> StatInfo | None:
    if guest in DIRS:
        return synthetic_stat(stat.S_IFDIR | 0o755)
    if guest in FILES:
        return synthetic_stat(stat.S_IFREG | 0o444, len(FILES[guest]))
    return None
