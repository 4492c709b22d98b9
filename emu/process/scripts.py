"""Scripts that execve runs: a file that starts with "#!" names its interpreter and at most one
argument on that line, as fs/binfmt_script.c reads it. The interpreter runs with the line's argument
(if any), the script's path and the caller's arguments after argv[0]. An interpreter may be a script
itself, up to 4 levels deep (then ELOOP); an empty "#!" line is ENOEXEC."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from emu.kernel.errno_ import SyscallError

HEAD = 256  # BINPRM_BUF_SIZE: the "#!" line is read from the file's first bytes
MAX_DEPTH = 4  # binfmt_script may nest interpreters this deep (the kernel's bprm->interp_depth limit)


def interpreter_line(head: bytes) -> tuple[str, str | None] | None:
    """(interpreter, its optional argument) of a file starting with ``head``; None: not a script."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].replace(b"\t", b" ").strip()
    if not line:
        raise SyscallError(errno.ENOEXEC)
    interpreter, _, argument = line.partition(b" ")
    argument = argument.strip()
    return os.fsdecode(interpreter), os.fsdecode(argument) if argument else None


def resolve(path: str, argv: list[str], head_of: Callable[[str], bytes]) -> tuple[str, list[str]]:
    """The program execve of ``path`` with ``argv`` runs, and its arguments: ``path`` itself, or the
    interpreter its "#!" line names (``head_of(path)``: the file's first bytes)."""
    for _ in range(MAX_DEPTH + 1):
        line = interpreter_line(head_of(path))
        if line is None:
            return path, argv
        interpreter, argument = line
        argv = [interpreter, *([argument] if argument is not None else []), path, *argv[1:]]
        path = interpreter
    raise SyscallError(errno.ELOOP)


def host_head(path: str) -> bytes:
    """The first bytes of a regular host file (none if it is not one or cannot be read: the loader then
    says why; a FIFO is never opened, which would wait for a writer)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return b""
        with open(path, "rb") as fh:
            return fh.read(HEAD)
    except (OSError, ValueError):
        return b""
