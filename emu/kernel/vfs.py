"""Guest paths resolved inside a root directory: symlinks followed inside the root, the guest's
own layer (overlay.py) in front of the host's read-only tree, one lock table for the run.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.files import StatInfo
from emu.kernel.state import LockTable

if TYPE_CHECKING:
    from emu.kernel.overlay import Inode, Overlay

MAX_SYMLINKS = 40
NAME_MAX = 255


class Vfs:
    """Resolves guest paths to host paths inside ``root``, following symlinks inside the root."""

    def __init__(self, root: str, cwd: str = "/", overlay: Overlay | None = None,
                 locks: LockTable | None = None) -> None:
        self.root = os.path.realpath(root)
        self.cwd = cwd
        self.overlay = overlay  # the guest's writable layer; None: a read-only mount (EROFS)
        self.locks = locks if locks is not None else LockTable()

    def fork(self) -> Vfs:
        """A child process's view: its own cwd, the same file system and file locks."""
        return Vfs(self.root, self.cwd, self.overlay, self.locks)

    def host_path(self, guest_abs: str) -> str:
        return os.path.join(self.root, guest_abs.lstrip("/")) if self.root != "/" else guest_abs

    def backing(self, guest: str) -> Inode | str:
        """What serves a canonical guest path: the guest's own inode, or a host path."""
        return self.overlay.backing(guest) if self.overlay is not None else self.host_path(guest)

    def host_of(self, guest: str) -> str | None:
        """The host file behind a guest path, None when the guest's layer holds it."""
        node = self.backing(guest)
        return node if isinstance(node, str) else None

    def lstat(self, guest: str) -> StatInfo:
        if self.overlay is not None:
            return self.overlay.lstat(guest)
        try:
            return StatInfo.from_host(os.lstat(self.host_path(guest)))
        except OSError as exc:  # ENOENT, ENOTDIR, EACCES, ELOOP, ENAMETOOLONG...: the guest's errno
            raise SyscallError(exc.errno or errno.ENOENT) from None

    def readlink(self, guest: str) -> str:
        if self.overlay is not None:
            return self.overlay.readlink(guest)
        try:
            return os.readlink(self.host_path(guest))
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EINVAL) from None

    def absolute(self, path: str, base: str | None = None) -> str:
        if path.startswith("/"):
            return path
        return os.path.join(base or self.cwd, path)

    def resolve(self, path: str, base: str | None = None, follow: bool = True,
                special: Callable[[str], bool] | None = None) -> str:
        """Canonical guest path of ``path``; ENOENT/ENOTDIR/ELOOP as Linux would say.

        Symlinks are followed inside the root: ``..`` stops at the root and an absolute target
        restarts from the root, so no path leaves it. ``special(prefix)`` marks a prefix the
        kernel serves itself (/proc/<pid>): the rest of the path is appended as is, never
        looked up on the host (where e.g. /proc/self would be the harness's own process).
        """
        if path == "":
            raise SyscallError(errno.ENOENT)
        if len(path) >= 4096:
            raise SyscallError(errno.ENAMETOOLONG)
        pending = [c for c in self.absolute(path, base).split("/") if c]
        trailing_slash = path.endswith("/")
        done: list[str] = []
        links = 0
        while pending:
            comp = pending.pop(0)
            if comp == ".":
                continue
            if comp == "..":
                if done:
                    done.pop()
                continue
            candidate = "/" + "/".join(done + [comp])
            if special is not None and special(candidate):
                return "/" + "/".join(done + [comp] + pending)
            if len(os.fsencode(comp)) > NAME_MAX:
                raise SyscallError(errno.ENAMETOOLONG)
            mode = self.lstat(candidate).mode
            is_last = not pending
            if stat.S_ISLNK(mode) and (not is_last or follow or trailing_slash):
                links += 1
                if links > MAX_SYMLINKS:
                    raise SyscallError(errno.ELOOP)
                target = self.readlink(candidate)
                parts = [c for c in target.split("/") if c]
                if target.startswith("/"):
                    done = []
                pending = parts + pending
                continue
            if not is_last and not stat.S_ISDIR(mode):
                raise SyscallError(errno.ENOTDIR)
            if is_last and trailing_slash and not stat.S_ISDIR(mode):
                raise SyscallError(errno.ENOTDIR)
            done.append(comp)
        return "/" + "/".join(done)
