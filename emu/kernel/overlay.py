"""The guest's writable layer: an in-memory tree over the read-only host view.

Like overlayfs with a tmpfs upper layer: a guest path is served by the nearest entry on its way
to the root that the guest has changed (a file, directory or symlink kept in memory, or a
whiteout: a name the guest removed), else by the host tree below the root. A directory kept in
memory may still show a host directory's entries through (``lower``): that is how a renamed or
chmod'ed host directory keeps its content without copying it. A host file changed by the guest
is copied up on its first write, with the host's inode number, owner and times; until then its
bytes are read from the host file. Nothing here ever opens a host file for writing: the host
tree is only read (``save`` writes a copy of the changes elsewhere, after the run, if asked).
The open files of the layer: overlay_files.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.files import DT_TYPES, StatInfo
from emu.process.vma import SharedPages

if TYPE_CHECKING:
    from emu.process.memory import Memory

FIRST_INO = 0x7E00_0000  # far above the inode numbers of the test trees; no clash with a host file
BLOCK = 512


class Kind(Enum):
    REG = stat.S_IFREG
    DIR = stat.S_IFDIR
    LNK = stat.S_IFLNK
    FIFO = stat.S_IFIFO
    OTHER = 0  # a host device or socket that was chmod'ed or renamed: kept with its host mode


@dataclass(eq=False, slots=True)
class SharedMap:
    """A MAP_SHARED mapping of an overlay file in one process's memory."""

    mem: Memory
    start: int
    offset: int
    length: int


@dataclass(eq=False, slots=True, weakref_slot=True)  # (a FIFO's kernel side is kept by its inode: fifo.py)
class Inode:
    """A file the guest made or changed. ``mode`` carries the file type bits as st_mode does."""

    kind: Kind
    mode: int
    ino: int
    dev: int
    uid: int
    gid: int
    mtime_ns: int
    ctime_ns: int
    atime_ns: int
    nlink: int = 1
    rdev: int = 0
    lower: str | None = None  # DIR: the host directory whose entries show through
    content_from: str | None = None  # REG: the host file whose bytes it still has (copied on first write)
    target: str = ""  # LNK
    _data: bytearray | None = None
    maps: list[SharedMap] = field(default_factory=list)
    # The file's pages as MAP_SHARED mappings show them, by file offset: every process mapping a range
    # one of them covers maps that host memory, so their stores meet at once (the file's bytes follow
    # at the syscalls that look at them: see _pull).
    pages: list[tuple[int, SharedPages]] = field(default_factory=list)

    @property
    def data(self) -> bytearray:
        """The bytes, copied up from the host file on first use; shared mappings' writes pulled in."""
        if self._data is None:
            self._data = bytearray()
            if self.content_from is not None:
                try:
                    with open(self.content_from, "rb") as f:  # read-only: the host file is never written
                        self._data = bytearray(f.read())
                except OSError as exc:
                    raise SyscallError(exc.errno or errno.EIO) from None
            self.content_from = None
        if self.maps:
            self._pull()
        return self._data

    @property
    def size(self) -> int:
        if self.kind is Kind.LNK:
            return len(os.fsencode(self.target))
        if self.kind is Kind.DIR:
            return 4096
        if self._data is None and self.content_from is not None:
            try:
                return os.stat(self.content_from).st_size
            except OSError:
                return 0
        return len(self.data)

    def stat(self) -> StatInfo:
        size = self.size
        blocks = 0 if self.kind is Kind.LNK else (size + 4095) // 4096 * (4096 // BLOCK)
        return StatInfo(self.dev, self.ino, self.mode, self.nlink, self.uid, self.gid, self.rdev, size,
                        4096, blocks, self.atime_ns, self.mtime_ns, self.ctime_ns)

    # ---------------------------------------------------------------- MAP_SHARED coherence
    def _live_maps(self) -> Iterator[SharedMap]:
        """Mappings still in place (an unmapped or replaced range is forgotten)."""
        kept = []
        for m in self.maps:
            vma = m.mem.find(m.start)
            if vma is not None and vma.shared and vma.inode == self.ino and vma.start <= m.start:
                kept.append(m)
        self.maps = kept
        return iter(kept)

    def _pull(self) -> None:
        """What the guest stored through its shared mappings, into the file (as the page cache holds it)."""
        assert self._data is not None
        for m in self._live_maps():
            self.pull_range(m, m.start, m.start + m.length)

    def pull_range(self, m: SharedMap, lo: int, hi: int) -> None:
        assert self._data is not None
        lo, hi = max(lo, m.start), min(hi, m.start + m.length)
        file_lo = m.offset + (lo - m.start)
        file_hi = min(file_lo + (hi - lo), len(self._data))
        if file_hi > file_lo:
            with contextlib.suppress(Exception):  # an unmapped page: nothing to take from it
                self._data[file_lo:file_hi] = m.mem.read(lo, file_hi - file_lo)

    def push(self, lo: int, hi: int) -> None:
        """File bytes [lo, hi) changed by write(): into every shared mapping that shows them."""
        assert self._data is not None
        for m in self._live_maps():
            a, b = max(lo, m.offset), min(hi, m.offset + m.length, len(self._data))
            if b > a:
                with contextlib.suppress(Exception):  # the range went away: the file keeps the bytes
                    m.mem.write(m.start + (a - m.offset), bytes(self._data[a:b]))

    def shared_pages(self, offset: int, length: int) -> tuple[SharedPages, int]:
        """Host pages for a MAP_SHARED mapping of [offset, offset+length): those of an earlier mapping
        that covers the range, else new ones (a range only partly covered gets its own pages)."""
        for start, pages in self.pages:
            if start <= offset and offset + length <= start + pages.size:
                return pages, offset - start
        pages = SharedPages(length)
        self.pages.append((offset, pages))
        return pages, 0

    def release_maps(self, mem: Memory, lo: int, hi: int) -> None:
        """munmap/msync of [lo, hi): the guest's stores there are written back first."""
        if self._data is None:
            self.data  # noqa: B018 - materialise before taking the mapped bytes
        for m in list(self.maps):
            if m.mem is mem and m.start < hi and lo < m.start + m.length:
                self.pull_range(m, lo, hi)


def _parent(path: str) -> str:
    return path.rpartition("/")[0] or "/"


def _join(base: str, rel: str) -> str:
    return base.rstrip("/") + "/" + rel.lstrip("/") if rel.strip("/") else base


class Overlay:
    """Every change one run's guest processes made to their file system (shared by all of them)."""

    def __init__(self, host_path: Callable[[str], str], now_ns: Callable[[], int]) -> None:
        self.host_path = host_path
        self.now_ns = now_ns
        self.entries: dict[str, Inode | None] = {}  # None: a whiteout (the guest removed the name)
        self.children: dict[str, set[str]] = {}  # directory -> names of its entries above
        self.mapped: set[Inode] = set()  # inodes with MAP_SHARED mappings to write back
        self.copied: dict[tuple[int, int], Inode] = {}  # host (st_dev, st_ino) -> its copy in the guest's layer
        self._next_ino = FIRST_INO

    # ---------------------------------------------------------------- lookup
    def backing(self, guest: str) -> Inode | str:
        """What serves a canonical guest path: an inode in memory, or a host path (which may not exist)."""
        if not self.entries:
            return self.host_path(guest)
        p = guest
        while True:
            if p in self.entries:
                node = self.entries[p]
                if node is None:
                    raise SyscallError(errno.ENOENT)
                if p == guest:
                    return node
                if node.kind is not Kind.DIR:
                    raise SyscallError(errno.ENOTDIR)
                if node.lower is None:
                    raise SyscallError(errno.ENOENT)
                return _join(node.lower, guest[len(p):])
            if p == "/":
                return self.host_path(guest)
            p = _parent(p)

    def lstat(self, guest: str) -> StatInfo:
        node = self.backing(guest)
        if isinstance(node, Inode):
            return node.stat()
        try:
            return StatInfo.from_host(os.lstat(node))
        except OSError as exc:
            raise SyscallError(exc.errno or errno.ENOENT) from None

    def readlink(self, guest: str) -> str:
        node = self.backing(guest)
        if isinstance(node, Inode):
            if node.kind is not Kind.LNK:
                raise SyscallError(errno.EINVAL)
            return node.target
        try:
            return os.readlink(node)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EINVAL) from None

    def exists(self, guest: str) -> bool:
        try:
            self.lstat(guest)
        except SyscallError:
            return False
        return True

    def touched(self, guest: str) -> bool:
        """Does the guest's layer change what this directory lists?"""
        return bool(self.children.get(guest)) or isinstance(self.entries.get(guest), Inode)

    def listing(self, guest: str) -> list[tuple[int, int, bytes]]:
        """getdents records of a directory: the host's entries (minus whiteouts) and then the guest's."""
        node = self.backing(guest)
        here = self.lstat(guest).ino
        parent = self.lstat(_parent(guest)).ino
        lower = node.lower if isinstance(node, Inode) else node
        names: dict[str, tuple[int, int]] = {}
        if lower is not None:
            try:
                with os.scandir(lower) as it:
                    for entry in it:
                        st = entry.stat(follow_symlinks=False)
                        names[entry.name] = (st.st_ino, DT_TYPES.get(stat.S_IFMT(st.st_mode), 0))
            except OSError:
                pass
        for name in sorted(self.children.get(guest, ())):
            child = self.entries[_join(guest, name)]
            if child is None:
                names.pop(name, None)
            else:
                names[name] = (child.ino, DT_TYPES.get(stat.S_IFMT(child.mode), 0))
        return [(here, 4, b"."), (parent, 4, b"..")] + [(ino, t, os.fsencode(n)) for n, (ino, t) in names.items()]

    def is_empty_dir(self, guest: str) -> bool:
        return len(self.listing(guest)) == 2

    # ---------------------------------------------------------------- changes
    def new_inode(self, kind: Kind, perm: int, uid: int, gid: int, dev: int) -> Inode:
        self._next_ino += 1
        now = self.now_ns()
        return Inode(kind, kind.value | (perm & 0o7777), self._next_ino, dev, uid, gid, now, now, now,
                     nlink=2 if kind is Kind.DIR else 1, _data=bytearray() if kind is Kind.REG else None)

    def dev_for(self, parent: str) -> int:
        """st_dev of a file created in ``parent``: the directory's own, so that a new file is on the
        same device as its neighbours (find -xdev, du -x and cp -x keep walking into it)."""
        return self.lstat(parent).dev

    def put(self, guest: str, node: Inode) -> None:
        """A new name (nothing is below it: a removed directory took its entries along)."""
        self.entries[guest] = node
        self.children.setdefault(_parent(guest), set()).add(guest.rpartition("/")[2])

    def copy_up(self, guest: str) -> Inode:
        """The guest's own inode for a path (host files keep their identity; bytes come lazily)."""
        node = self.backing(guest)
        if isinstance(node, Inode):
            return node
        try:
            st = os.lstat(node)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.ENOENT) from None
        fmt = stat.S_IFMT(st.st_mode)
        kind = next((k for k in Kind if k.value == fmt and k is not Kind.OTHER), Kind.OTHER)
        inode = Inode(kind, st.st_mode, st.st_ino, st.st_dev, st.st_uid, st.st_gid, st.st_mtime_ns,
                      st.st_ctime_ns, st.st_atime_ns, nlink=st.st_nlink, rdev=st.st_rdev)
        if kind is Kind.REG:
            inode.content_from = node
            self.copied[(st.st_dev, st.st_ino)] = inode
        elif kind is Kind.DIR:
            inode.lower = node
        elif kind is Kind.LNK:
            inode.target = os.readlink(node)
        # what the guest changed below a copied-up directory stays; the rest shows through ``lower``
        self.entries[guest] = inode
        if guest != "/":
            self.children.setdefault(_parent(guest), set()).add(guest.rpartition("/")[2])
        return inode

    def remove(self, guest: str) -> None:
        """The name is gone: a whiteout hides the host's file, if the host has one there."""
        if stat.S_ISDIR(self.lstat(guest).mode):
            self._drop_below(guest)
        self.entries.pop(guest, None)
        name = guest.rpartition("/")[2]
        lower = self.backing(guest) if self._ancestor_allows(guest) else None
        if isinstance(lower, str) and os.path.lexists(lower):
            self.entries[guest] = None
            self.children.setdefault(_parent(guest), set()).add(name)
        else:
            self.children.get(_parent(guest), set()).discard(name)

    def _ancestor_allows(self, guest: str) -> bool:
        try:
            self.backing(guest)
        except SyscallError:
            return False
        return True

    def move(self, old: str, new: str) -> None:
        """rename(2) of a whole subtree: its entries move under the new name."""
        node = self.copy_up(old)
        prefix = old.rstrip("/") + "/"
        below = {new + k[len(old):]: v for k, v in self.entries.items() if k.startswith(prefix)}
        self.remove(old)
        if self.exists(new):
            self._drop_below(new)  # an empty directory replaced: its whiteouts go with it
        self.put(new, node)
        for path, child in below.items():
            self.entries[path] = child
            self.children.setdefault(_parent(path), set()).add(path.rpartition("/")[2])
        node.ctime_ns = self.now_ns()

    def exchange(self, a: str, b: str) -> None:
        """renameat2(RENAME_EXCHANGE): two existing names swap what they hold, subtrees included."""
        nodes = self.copy_up(a), self.copy_up(b)
        below = [{k[len(p):]: v for k, v in self.entries.items() if k.startswith(p + "/")} for p in (a, b)]
        self._drop_below(a)
        self._drop_below(b)
        for path, node, subtree in ((a, nodes[1], below[1]), (b, nodes[0], below[0])):
            self.entries[path] = node
            for rel, child in subtree.items():
                self.entries[path + rel] = child
                self.children.setdefault(_parent(path + rel), set()).add((path + rel).rpartition("/")[2])

    def _drop_below(self, guest: str) -> None:
        prefix = guest.rstrip("/") + "/"
        for path in [p for p in self.entries if p.startswith(prefix)]:
            del self.entries[path]
        for path in [p for p in self.children if p == guest or p.startswith(prefix)]:
            del self.children[path]

    def changed_paths(self) -> list[tuple[str, Inode | None]]:
        return sorted(self.entries.items())

    # ---------------------------------------------------------------- --save-writes
    def save(self, dest: str) -> int:
        """Copy the guest's files, directories and symlinks under ``dest``; removed names are listed
        in ``dest/.whiteouts``. Returns how many entries were written."""
        written = 0
        removed: list[str] = []
        for guest, node in self.changed_paths():
            target = os.path.join(dest, guest.lstrip("/"))
            if node is None:
                removed.append(guest)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if node.kind is Kind.DIR:
                os.makedirs(target, exist_ok=True)
            elif node.kind is Kind.LNK:
                if not os.path.lexists(target):
                    os.symlink(node.target, target)
            elif node.kind is Kind.REG:
                with open(target, "wb") as f:
                    f.write(node.data)
            else:
                continue
            if node.kind is not Kind.LNK:
                os.chmod(target, node.mode & 0o7777)
            written += 1
        if removed:
            with open(os.path.join(dest, ".whiteouts"), "w", encoding="utf-8", errors="surrogateescape") as f:
                f.writelines(p + "\n" for p in removed)
        return written
