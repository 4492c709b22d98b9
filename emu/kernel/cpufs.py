"""/proc/cpuinfo, /proc/stat and /sys/devices/system/cpu, made up from the emulated CPU model (cpumodel.py).

Served whatever the root, as the host's would describe another CPU: glibc's get_nprocs() and
sysconf(_SC_NPROCESSORS_ONLN/CONF) read /sys/devices/system/cpu/{online,possible} (Python's
os.cpu_count() with them), get_nprocs_conf() may list the cpuN directories, nproc asks
sched_getaffinity (process.py), and they all count KernelConfig.cpus.
"""

from __future__ import annotations

import errno
import posixpath
import re
import stat
from typing import TYPE_CHECKING

from emu import abi
from emu.cpumodel import MAX_CPUS
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import DT_TYPES, OpenFile, StatInfo, SyntheticDir, kernel_made_file, synthetic_stat

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

CPUINFO = "/proc/cpuinfo"
STAT = "/proc/stat"
CPU_DIR = "/sys/devices/system/cpu"
_CPU_N = re.compile(rf"^{CPU_DIR}/cpu(0|[1-9][0-9]*)(/online)?$")
DT_DIR, DT_REG = DT_TYPES[stat.S_IFDIR], DT_TYPES[stat.S_IFREG]
_INO = 0x7C000


def _files(k: Kernel) -> dict[str, bytes]:
    model = k.cpu_model
    cpus = model.cpu_list().encode() + b"\n"
    return {
        "online": cpus, "possible": cpus, "present": cpus, "offline": b"\n", "isolated": b"\n",
        "kernel_max": f"{MAX_CPUS - 1}\n".encode(),
    }


def _stat(k: Kernel) -> str:
    """/proc/stat with one line a CPU (glibc's get_nprocs falls back to counting them): no time spent
    anywhere yet, booted when the virtual clock starts."""
    idle = " 0" * 10
    lines = [f"cpu {idle}"] + [f"cpu{n}{idle}" for n in range(k.cpu_model.cpus)]
    lines += ["intr 0", "ctxt 0", f"btime {k.config.realtime_start_ns // 10**9}", "processes 1", "procs_running 1",
              "procs_blocked 0", "softirq" + " 0" * 11]
    return "\n".join(lines) + "\n"


def _cpu(k: Kernel, path: str) -> tuple[int, bool] | None:
    """(n, asks for its online file) for /sys/devices/system/cpu/cpuN[/online] of an existing CPU."""
    match = _CPU_N.match(path)
    if match is None or int(match.group(1)) >= k.cpu_model.cpus:
        return None
    n = int(match.group(1))
    online = match.group(2) is not None
    return None if online and n == 0 else (n, online)  # cpu0 cannot go offline: it has no online file


def serves(k: Kernel, path: str) -> bool:
    norm = posixpath.normpath(path)
    return norm in (CPUINFO, STAT, CPU_DIR) or norm.startswith(CPU_DIR + "/")


def _content(k: Kernel, guest: str) -> bytes | None:
    if guest == CPUINFO:
        return k.cpu_model.cpuinfo().encode()
    if guest == STAT:
        return _stat(k).encode()
    if guest.startswith(CPU_DIR + "/") and "/" not in guest[len(CPU_DIR) + 1:]:
        return _files(k).get(guest[len(CPU_DIR) + 1:])
    cpu = _cpu(k, guest)
    return b"1\n" if cpu is not None and cpu[1] else None


def _is_dir(k: Kernel, guest: str) -> bool:
    if guest == CPU_DIR:
        return True
    cpu = _cpu(k, guest)
    return cpu is not None and not cpu[1]


def _listing(k: Kernel, guest: str) -> list[tuple[int, int, bytes]]:
    entries = [(_INO, DT_DIR, b"."), (_INO - 1, DT_DIR, b"..")]
    if guest == CPU_DIR:
        entries += [(_INO + 1 + n, DT_DIR, f"cpu{n}".encode()) for n in range(k.cpu_model.cpus)]
        entries += [(_INO + MAX_CPUS + i, DT_REG, name.encode()) for i, name in enumerate(sorted(_files(k)))]
    elif guest != f"{CPU_DIR}/cpu0":
        entries.append((_INO + 2 * MAX_CPUS, DT_REG, b"online"))
    return entries


def stat_of(k: Kernel, guest: str) -> StatInfo | None:
    if not serves(k, guest):
        return None
    if _is_dir(k, guest):
        return synthetic_stat(stat.S_IFDIR | 0o755)
    content = _content(k, guest)
    if content is None:
        raise SyscallError(errno.ENOENT)
    # sysfs files say 4096 bytes whatever they hold; procfs files say 0
    return synthetic_stat(stat.S_IFREG | 0o444, 0 if guest.startswith("/proc/") else abi.PAGE_SIZE)


def open_file(k: Kernel, guest: str, flags: int) -> OpenFile | None:
    if not serves(k, guest):
        return None
    writing = flags & abi.O_ACCMODE
    if _is_dir(k, guest):
        if writing:
            raise SyscallError(errno.EISDIR)
        return SyntheticDir(guest, lambda: _listing(k, guest), stat_of(k, guest))
    return kernel_made_file(guest, _content(k, guest), flags, stat_of(k, guest))
