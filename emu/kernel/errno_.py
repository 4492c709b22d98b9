"""The errno boundary: handlers raise SyscallError; the dispatcher writes -errno to rax."""

from __future__ import annotations

import errno
import os


class SyscallError(Exception):
    def __init__(self, err: int) -> None:
        super().__init__(errno.errorcode.get(err, str(err)))
        self.errno = err


KERNEL_ONLY_ERRNOS = {524: "ENOTSUPP"}  # not in errno.h; the kernel's own (spec 4.1)


def errno_name(err: int) -> str:
    return errno.errorcode.get(err) or KERNEL_ONLY_ERRNOS.get(err, f"E{err}")


def errno_text(err: int) -> str:
    return "Operation is not supported" if err == 524 else os.strerror(err)
