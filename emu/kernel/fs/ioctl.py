"""ioctl (fs/ioctl.c): the generic file requests on any descriptor, a kernel object's own, and
the terminal's queries passed through to the host's terminal (never its setters)."""

from __future__ import annotations

import errno
import os
import struct
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import HostFile, MemFile, OpenFile
from emu.kernel.fs.namei import host_errno
from emu.kernel.pipe import PipeEnd

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


TCGETS, TIOCGWINSZ, TIOCGPGRP, FIONBIO = 0x5401, 0x5413, 0x540F, 0x5421


FIONREAD, FIONCLEX, FIOCLEX = 0x541B, 0x5450, 0x5451


# TCSETS/W/F, TCSBRK, TCXONC, TCFLSH, TIOCSCTTY, TIOCSPGRP, TIOCSTI, TIOCSWINSZ, TCSBRKP, TIOCSETD, TIOCNOTTY
TCSBRK = 0x5409


TTY_SETTERS = frozenset({0x5402, 0x5403, 0x5404, 0x5409, 0x540A, 0x540B, 0x540E, 0x5410, 0x5412, 0x5414, 0x5425,
                         0x5423, 0x5422})


TTY_IOCTL_SIZES = {TCGETS: 36, TIOCGWINSZ: 8, TIOCGPGRP: 4}


def sys_ioctl(k: Kernel, fd: int, request: int, arg: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    file = entry.file
    request &= 0xFFFFFFFF
    if entry.flags & abi.O_PATH:
        raise SyscallError(errno.EBADF)
    own = file.ioctl(request, arg)
    if own is not None:
        return own
    # The generic file ioctls (fs/ioctl.c do_vfs_ioctl) work on any descriptor.
    if request in (FIOCLEX, FIONCLEX):
        entry.cloexec = request == FIOCLEX
        return 0
    if request == FIONBIO:
        (on,) = struct.unpack("<i", k.mem.read_user(arg, 4))
        entry.flags = entry.flags | abi.O_NONBLOCK if on else entry.flags & ~abi.O_NONBLOCK
        return 0
    if request == FIONREAD and not file.is_directory:
        available = _bytes_available(file)
        if available is not None:
            k.mem.write_user(arg, struct.pack("<i", min(available, 0x7FFFFFFF)))
            return 0
    host = file.host_fd()
    if host is None or not os.isatty(host):
        raise SyscallError(errno.ENOTTY)  # Linux: every tty request on a non-tty, and any unknown request
    if request == TIOCGPGRP:
        # The guest is the foreground process group of its own world (getpgrp() says its pid too).
        k.mem.write_user(arg, struct.pack("<i", k.ident.pid))
        return 0
    if request == TCSBRK and arg:
        return 0  # tcdrain(): our writes are already out
    if request in TTY_SETTERS:
        raise SyscallError(errno.EPERM)  # the sandbox never changes the host's terminal
    size = TTY_IOCTL_SIZES.get(request)
    if size is None:
        raise SyscallError(errno.ENOTTY)
    # Read-only terminal queries pass through to the real terminal.
    import fcntl as host_fcntl

    try:
        data = host_fcntl.ioctl(host, request, b"\0" * size)
    except OSError as exc:
        raise host_errno(exc, errno.ENOTTY) from None
    k.mem.write_user(arg, data)
    return 0


def _bytes_available(file: OpenFile) -> int | None:
    if isinstance(file, PipeEnd):
        return len(file.pipe.buffer)
    if isinstance(file, MemFile):
        return max(0, len(file.content) - file.pos)
    if isinstance(file, HostFile):
        return file.size_left()
    return None
