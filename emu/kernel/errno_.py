"""The errno boundary: handlers raise SyscallError; the dispatcher writes -errno to rax."""

from __future__ import annotations

import errno
import os


class SyscallError(Exception):
    def __init__(self, err: int) -> None:
        super().__init__(errno.errorcode.get(err, str(err)))
        self.errno = err


def errno_name(err: int) -> str:
    return errno.errorcode.get(err, f"E{err}")


def errno_text(err: int) -> str:
    return os.strerror(err)
