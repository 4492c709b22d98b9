"""An AF_UNIX socket as a kernel object: the peer's queue of segments (bytes, SCM_RIGHTS riding
with them, a datagram's sender), reads and writes that sleep as a pipe's do, readiness for poll.
The socket syscalls: net.py.
"""

from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu.abi import Signal
from emu.kernel.blocking import notify, wait
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import OpenFile, StatInfo, synthetic_stat
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.signal import send_to_self

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

AF_UNIX = 1
SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET = 1, 2, 5
SOCK_NONBLOCK, SOCK_CLOEXEC = 0o4000, 0o2000000
SOL_SOCKET, SCM_RIGHTS, SCM_CREDENTIALS = 1, 1, 2
SO_TYPE, SO_ERROR, SO_SNDBUF, SO_RCVBUF, SO_PEERCRED, SO_ACCEPTCONN, SO_DOMAIN, SO_PROTOCOL = 3, 4, 7, 8, 17, 30, 39, 38
MSG_PEEK, MSG_TRUNC, MSG_DONTWAIT, MSG_NOSIGNAL, MSG_CTRUNC, MSG_CMSG_CLOEXEC = 0x2, 0x20, 0x40, 0x4000, 0x8, 0x40000000
MSG_WAITALL = 0x100
SHUT_RD, SHUT_WR, SHUT_RDWR = 0, 1, 2
POLLIN, POLLOUT, POLLERR, POLLHUP, POLLRDNORM, POLLWRNORM, POLLRDHUP = 0x1, 0x4, 0x8, 0x10, 0x40, 0x100, 0x2000
S_IFSOCK = 0o140000
SOCK_BUF = 212992  # net.core.wmem_default: what one side may have queued


@dataclass(eq=False)
class Segment:
    data: bytes
    files: list[OpenFile] = field(default_factory=list)  # SCM_RIGHTS riding with these bytes
    sender: bytes = b""  # the sender's address (datagrams)


class UnixSocket(OpenFile):
    """One end. Bytes sent go into the peer's queue; a stream reads across segments, a datagram or
    seqpacket socket one segment at a time."""

    def __init__(self, kind: int, ino: int, creds: tuple[int, int, int]) -> None:
        self.kind = kind
        self.ino = ino
        self.guest_path = f"socket:[{ino}]"
        self.creds = creds  # pid, uid, gid of the creator (SO_PEERCRED of its peer)
        self.peer: UnixSocket | None = None
        self.ever_connected = False
        self.queue: deque[Segment] = deque()
        self.queued = 0
        self.name: bytes = b""  # bound address (the sun_path bytes), b"": unnamed
        self.listening = False
        self.backlog: deque[UnixSocket] = deque()
        self.shut_rd = self.shut_wr = False  # this end's own shutdown
        self.peer_gone = False  # the peer closed or shut its writing side
        self.closed = False
        self.names: dict[bytes, OpenFile] | None = None  # the namespace it is bound in (Family.unix_names)

    # ------------------------------------------------------------------ OpenFile
    def stat(self) -> StatInfo:
        return synthetic_stat(S_IFSOCK | 0o777, ino=self.ino)

    def close(self) -> None:
        self.closed = True
        if self.names is not None and self.names.get(self.name) is self:
            del self.names[self.name]
        peer = self.peer
        if peer is not None:
            peer.peer_gone = True
        for pending in self.backlog:
            pending.close()

    def close_key(self) -> tuple[object, ...]:
        return (self, self.peer) if self.peer is not None else (self,)

    def poll_mask(self) -> int:
        """unix_poll: readable with data or once nothing more can come, hung up when the peer is gone."""
        if self.listening:
            return POLLIN | POLLRDNORM if self.backlog else 0
        mask = 0
        peer = self.peer
        if self.queue or self.shut_rd or self.peer_gone:
            mask |= POLLIN | POLLRDNORM
        if self.peer_gone or self.shut_rd:
            mask |= POLLRDHUP
        if peer is not None and peer.closed or self.shut_rd and self.shut_wr:
            mask |= POLLHUP
        if peer is None and self.kind == SOCK_DGRAM or peer is not None and (peer.closed or peer.queued < SOCK_BUF):
            mask |= POLLOUT | POLLWRNORM
        return mask

    # ------------------------------------------------------------------ data
    def k_read(self, k: Kernel, entry: FdEntry, size: int) -> bytes:
        return self.receive(k, entry, size, 0)[0]

    def k_write(self, k: Kernel, entry: FdEntry, data: bytes) -> int:
        return self.send(k, entry, data, 0, [], None)

    def send(self, k: Kernel, entry: FdEntry, data: bytes, flags: int, files: list[OpenFile],
             to: UnixSocket | None) -> int:
        target = to or self.peer
        if self.listening:
            raise SyscallError(errno.ENOTCONN)
        if self.shut_wr:
            _sigpipe(k, flags)
        if target is None:
            raise SyscallError(errno.EDESTADDRREQ if self.kind == SOCK_DGRAM else errno.ENOTCONN)
        if target.closed:
            if self.kind == SOCK_DGRAM:
                raise SyscallError(errno.ECONNREFUSED)
            _sigpipe(k, flags)
        if target.shut_rd and self.kind != SOCK_DGRAM:
            _sigpipe(k, flags)
        if self.kind != SOCK_STREAM and len(data) > SOCK_BUF:
            raise SyscallError(errno.EMSGSIZE)
        free = SOCK_BUF - target.queued
        if free <= 0 or self.kind != SOCK_STREAM and free < len(data):
            _sleep(k, entry, flags, f"send on a full socket ({self.guest_path})", target)
        taken = data if self.kind != SOCK_STREAM else data[:free]
        target.queue.append(Segment(taken, files, self.name))
        target.queued += len(taken)
        notify(k, target)
        return len(taken)

    def receive(self, k: Kernel, entry: FdEntry, size: int, flags: int) -> tuple[bytes, list[OpenFile], bytes, int]:
        """(data, passed files, sender address, the datagram's full length)."""
        if self.listening or self.kind != SOCK_DGRAM and not self.ever_connected and self.peer is None:
            raise SyscallError(errno.EINVAL if self.listening else errno.ENOTCONN)
        if not self.queue:
            if self.shut_rd or self.peer_gone or self.peer is None and self.kind != SOCK_DGRAM:
                return b"", [], b"", 0
            _sleep(k, entry, flags, f"receive on an empty socket ({self.guest_path})", self)
        if self.kind != SOCK_STREAM:
            seg = self.queue[0] if flags & MSG_PEEK else self.queue.popleft()
            if not flags & MSG_PEEK:
                self.queued -= len(seg.data)
                self._changed(k)
            return seg.data[:size], seg.files, seg.sender, len(seg.data)
        return self._stream_read(k, size, flags)

    def _stream_read(self, k: Kernel, size: int, flags: int) -> tuple[bytes, list[OpenFile], bytes, int]:
        out = bytearray()
        files: list[OpenFile] = []
        for seg in list(self.queue):
            if len(out) >= size or files and seg.files:
                break
            piece = seg.data[:size - len(out)]
            out += piece
            files += seg.files
            if flags & MSG_PEEK:
                continue
            seg.files = []
            if len(piece) == len(seg.data):
                self.queue.popleft()
            else:
                seg.data = seg.data[len(piece):]
        if not flags & MSG_PEEK:
            self.queued -= len(out)
            self._changed(k)
        return bytes(out), files, b"", len(out)

    def _changed(self, k: Kernel) -> None:
        if self.peer is not None:
            notify(k, self)  # its writer waits on this queue


def _sleep(k: Kernel, entry: FdEntry, flags: int, what: str, on: UnixSocket) -> None:
    if flags & MSG_DONTWAIT:
        raise SyscallError(errno.EAGAIN)
    wait(k, entry, what, (on,))


def _sigpipe(k: Kernel, flags: int) -> None:
    if not flags & MSG_NOSIGNAL:
        send_to_self(k, Signal.SIGPIPE)
    raise SyscallError(errno.EPIPE)
