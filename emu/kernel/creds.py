"""The id-changing system calls: setuid, setreuid, setresuid and their gid twins, getresuid, getresgid.

The model keeps one user id and one group id per process (Identity.uid, .gid), which the real,
effective and saved ids all are. A call that keeps them all equal behaves as on Linux (kernel/sys.c):
asking for the ids the process has is allowed to anyone, and so is a change made with CAP_SETUID
(CAP_SETGID), which uid 0 has; anything else is EPERM. A call that would leave the three ids apart
(root's seteuid(1000), say) is refused with EPERM too: the model cannot hold it.
"""

from __future__ import annotations

import dataclasses
import errno
import struct
from typing import TYPE_CHECKING

from emu.abi import signed32
from emu.kernel.errno_ import SyscallError

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

UNCHANGED = -1


def _change(k: Kernel, field: str, wanted: tuple[int, ...]) -> int:
    """Set the process's ``field`` ("uid" or "gid") to the one value ``wanted`` names (-1: unchanged)."""
    given = [signed32(w) for w in wanted]
    requested = {i for i in given if i != UNCHANGED}
    if requested <= {getattr(k.ident, field)}:
        return 0  # the ids the process has: anyone may
    if k.ident.uid != 0 or len(requested) != 1 or UNCHANGED in given:  # no capability, or ids left apart
        raise SyscallError(errno.EPERM)
    value = requested.pop() & 0xFFFFFFFF
    k.ident = dataclasses.replace(k.ident, uid=value) if field == "uid" else dataclasses.replace(k.ident, gid=value)
    return 0


def sys_setuid(k: Kernel, uid: int, *_: int) -> int:
    return _change(k, "uid", (uid,))


def sys_setgid(k: Kernel, gid: int, *_: int) -> int:
    return _change(k, "gid", (gid,))


def sys_setreuid(k: Kernel, ruid: int, euid: int, *_: int) -> int:
    return _change(k, "uid", (ruid, euid))


def sys_setregid(k: Kernel, rgid: int, egid: int, *_: int) -> int:
    return _change(k, "gid", (rgid, egid))


def sys_setresuid(k: Kernel, ruid: int, euid: int, suid: int, *_: int) -> int:
    return _change(k, "uid", (ruid, euid, suid))


def sys_setresgid(k: Kernel, rgid: int, egid: int, sgid: int, *_: int) -> int:
    return _change(k, "gid", (rgid, egid, sgid))


def _put_three(k: Kernel, value: int, addrs: tuple[int, int, int]) -> int:
    for addr in addrs:
        k.mem.write_user(addr, struct.pack("<I", value))
    return 0


def sys_getresuid(k: Kernel, ruid: int, euid: int, suid: int, *_: int) -> int:
    return _put_three(k, k.ident.uid, (ruid, euid, suid))


def sys_getresgid(k: Kernel, rgid: int, egid: int, sgid: int, *_: int) -> int:
    return _put_three(k, k.ident.gid, (rgid, egid, sgid))
