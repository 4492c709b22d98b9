"""No network: every socket call is refused the way a sandbox without network would refuse it."""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


def sys_no_network(k: Kernel, *_: int) -> int:
    raise SyscallError(errno.EACCES)
