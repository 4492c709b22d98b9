"""Sockets inside the guest only: AF_UNIX stream, datagram and seqpacket sockets between the run's
threads and processes (socketpair, bind/listen/accept/connect on filesystem or abstract names, send
and receive with SCM_RIGHTS, shutdown, names and peer credentials). Names live in the run's own
namespace (family.FamilyOf.unix_names): nothing is created on the host, and a filesystem name goes away
with its socket. AF_INET, AF_INET6 and every other family are refused as a sandbox without network
refuses them (EACCES). The socket object and its queues: unix.py.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel.blocking import notify, wait
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import OpenFile
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.fs.read_write import MAX_IO
from emu.kernel.unix import (
    AF_UNIX,
    MSG_CMSG_CLOEXEC,
    MSG_CTRUNC,
    MSG_TRUNC,
    SCM_CREDENTIALS,
    SCM_RIGHTS,
    SHUT_RD,
    SHUT_RDWR,
    SHUT_WR,
    SO_ACCEPTCONN,
    SO_DOMAIN,
    SO_ERROR,
    SO_PEERCRED,
    SO_PROTOCOL,
    SO_RCVBUF,
    SO_SNDBUF,
    SO_TYPE,
    SOCK_BUF,
    SOCK_CLOEXEC,
    SOCK_DGRAM,
    SOCK_NONBLOCK,
    SOCK_SEQPACKET,
    SOCK_STREAM,
    SOL_SOCKET,
    UnixSocket,
)

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

SUN_PATH_MAX = 108
SOCKADDR_UN_MAX = 2 + SUN_PATH_MAX
MSGHDR = struct.Struct("<QI4xQQQQi4x")  # name, namelen, iov, iovlen, control, controllen, flags
CMSGHDR = struct.Struct("<Qii")


# ---------------------------------------------------------------------------- creating
def _names(k: Kernel) -> dict[bytes, OpenFile]:
    if k.family is None:
        raise SyscallError(errno.EACCES)
    return k.family.unix_names


def _bound(k: Kernel, path: bytes) -> UnixSocket | None:
    """The socket bound to ``path`` (only sys_bind adds to the run's names: each is a UnixSocket)."""
    target = _names(k).get(_key(k, path))
    return target if isinstance(target, UnixSocket) else None


def _new(k: Kernel, family: int, kind: int) -> tuple[UnixSocket, int]:
    flags = kind & (SOCK_NONBLOCK | SOCK_CLOEXEC)
    kind &= ~(SOCK_NONBLOCK | SOCK_CLOEXEC)
    if family != AF_UNIX:
        raise SyscallError(errno.EACCES)  # no network in the sandbox
    if kind not in (SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET):
        raise SyscallError(errno.EINVAL if kind > 10 else errno.ESOCKTNOSUPPORT)
    k.next_inode += 1
    return UnixSocket(kind, k.next_inode, (k.ident.pid, k.ident.uid, k.ident.gid)), flags


def _install(k: Kernel, sock: UnixSocket, flags: int) -> int:
    return k.files.install(FdEntry(sock, abi.O_RDWR | (abi.O_NONBLOCK if flags & SOCK_NONBLOCK else 0),
                                   bool(flags & SOCK_CLOEXEC)))


def sys_socket(k: Kernel, family: int, kind: int, protocol: int, *_: int) -> int:
    if family & 0xFFFF == AF_UNIX and protocol not in (0, AF_UNIX):
        raise SyscallError(errno.EPROTONOSUPPORT)
    sock, flags = _new(k, family & 0xFFFF, kind & 0xFFFFFFFF)
    return _install(k, sock, flags)


def sys_socketpair(k: Kernel, family: int, kind: int, protocol: int, fds: int, *_: int) -> int:
    if family & 0xFFFF == AF_UNIX and protocol not in (0, AF_UNIX):
        raise SyscallError(errno.EPROTONOSUPPORT)
    a, flags = _new(k, family & 0xFFFF, kind & 0xFFFFFFFF)
    b, _same = _new(k, family & 0xFFFF, kind & 0xFFFFFFFF)
    _pair(a, b)
    k.mem.check_user(fds, 8, abi.Prot.WRITE)
    first = _install(k, a, flags)
    try:
        second = _install(k, b, flags)
    except SyscallError:
        k.files.close(first)
        raise
    k.mem.write_user(fds, struct.pack("<ii", first, second))
    return 0


def _pair(a: UnixSocket, b: UnixSocket) -> None:
    a.peer, b.peer = b, a
    a.ever_connected = b.ever_connected = True


def _socket(k: Kernel, fd: int) -> tuple[FdEntry, UnixSocket]:
    entry = k.files.get(signed32(fd))
    if not isinstance(entry.file, UnixSocket):
        raise SyscallError(errno.ENOTSOCK)
    return entry, entry.file


# ---------------------------------------------------------------------------- addresses
def _read_addr(k: Kernel, addr: int, length: int) -> bytes:
    """The sun_path bytes of a sockaddr_un (abstract names keep their leading NUL)."""
    length = signed32(length)
    if length < 2 or length > SOCKADDR_UN_MAX:
        raise SyscallError(errno.EINVAL)
    raw = k.mem.read_user(addr, length)
    (family,) = struct.unpack_from("<H", raw)
    if family != AF_UNIX:
        raise SyscallError(errno.EINVAL if family else errno.EAFNOSUPPORT)
    path = raw[2:]
    if path[:1] == b"\0":
        return path
    path = path.split(b"\0", 1)[0]
    if not path:
        raise SyscallError(errno.EINVAL)
    return path


def _key(k: Kernel, path: bytes) -> bytes:
    """Filesystem names by their absolute guest path; abstract ones as they are."""
    if path[:1] == b"\0" or path.startswith(b"/"):
        return path
    return k.vfs.absolute(path.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def _write_addr(k: Kernel, name: bytes, addr: int, len_addr: int) -> None:
    if not addr and not len_addr:
        return
    (room,) = struct.unpack("<i", k.mem.read_user(len_addr, 4))
    if room < 0:
        raise SyscallError(errno.EINVAL)
    raw = struct.pack("<H", AF_UNIX) + name + (b"\0" if name and name[:1] != b"\0" else b"")
    k.mem.write_user(addr, raw[:room])
    k.mem.write_user(len_addr, struct.pack("<i", len(raw)))


def sys_bind(k: Kernel, fd: int, addr: int, length: int, *_: int) -> int:
    sock = _socket(k, fd)[1]
    path = _read_addr(k, addr, length)
    if sock.name:
        raise SyscallError(errno.EINVAL)
    names = _names(k)
    key = _key(k, path)
    if key in names:
        raise SyscallError(errno.EADDRINUSE)
    sock.name, sock.names = key, names
    names[key] = sock
    return 0


def sys_listen(k: Kernel, fd: int, backlog: int, *_: int) -> int:
    sock = _socket(k, fd)[1]
    if sock.kind == SOCK_DGRAM:
        raise SyscallError(errno.EOPNOTSUPP)
    if not sock.name or sock.peer is not None:
        raise SyscallError(errno.EINVAL)
    sock.listening = True
    return 0


def sys_connect(k: Kernel, fd: int, addr: int, length: int, *_: int) -> int:
    entry, sock = _socket(k, fd)
    path = _read_addr(k, addr, length)
    target = _bound(k, path)
    if target is None:
        raise SyscallError(errno.ECONNREFUSED if path[:1] == b"\0" else errno.ENOENT)
    if sock.kind != target.kind:
        raise SyscallError(errno.EPROTOTYPE)
    if sock.kind == SOCK_DGRAM:  # a default destination
        sock.peer, sock.ever_connected = target, True
        return 0
    if sock.peer is not None or sock.listening:
        raise SyscallError(errno.EISCONN)
    if not target.listening:
        raise SyscallError(errno.ECONNREFUSED)
    k.next_inode += 1
    server = UnixSocket(sock.kind, k.next_inode, target.creds)
    server.name = target.name
    _pair(sock, server)
    target.backlog.append(server)
    notify(k, target)
    return 0


def sys_accept4(k: Kernel, fd: int, addr: int, len_addr: int, flags: int, *_: int) -> int:
    entry, sock = _socket(k, fd)
    if flags & ~(SOCK_NONBLOCK | SOCK_CLOEXEC):
        raise SyscallError(errno.EINVAL)
    if not sock.listening:
        raise SyscallError(errno.EINVAL)
    if not sock.backlog:
        wait(k, entry, f"accept on {sock.guest_path}", (sock,))
    server = sock.backlog.popleft()
    peer = server.peer
    _write_addr(k, peer.name if peer is not None else b"", addr, len_addr)
    return _install(k, server, flags)


def sys_accept(k: Kernel, fd: int, addr: int, len_addr: int, *_: int) -> int:
    return sys_accept4(k, fd, addr, len_addr, 0)


def sys_getsockname(k: Kernel, fd: int, addr: int, len_addr: int, *_: int) -> int:
    sock = _socket(k, fd)[1]
    _write_addr(k, sock.name, addr, len_addr)
    return 0


def sys_getpeername(k: Kernel, fd: int, addr: int, len_addr: int, *_: int) -> int:
    sock = _socket(k, fd)[1]
    if sock.peer is None or sock.kind == SOCK_STREAM and sock.peer.closed:
        raise SyscallError(errno.ENOTCONN)
    _write_addr(k, sock.peer.name, addr, len_addr)
    return 0


def sys_shutdown(k: Kernel, fd: int, how: int, *_: int) -> int:
    sock = _socket(k, fd)[1]
    if how not in (SHUT_RD, SHUT_WR, SHUT_RDWR):
        raise SyscallError(errno.EINVAL)
    if sock.peer is None:
        raise SyscallError(errno.ENOTCONN)
    if how in (SHUT_RD, SHUT_RDWR):
        sock.shut_rd = True
    if how in (SHUT_WR, SHUT_RDWR):
        sock.shut_wr = True
        sock.peer.peer_gone = True
    notify(k, sock.peer)
    notify(k, sock)
    return 0


# ---------------------------------------------------------------------------- options
def sys_getsockopt(k: Kernel, fd: int, level: int, name: int, value: int, len_addr: int, *_: int) -> int:
    sock = _socket(k, fd)[1]
    if level != SOL_SOCKET:
        raise SyscallError(errno.EOPNOTSUPP)
    (room,) = struct.unpack("<i", k.mem.read_user(len_addr, 4))
    if room < 0:
        raise SyscallError(errno.EINVAL)
    if name == SO_PEERCRED:
        creds = sock.peer.creds if sock.peer is not None else (0, -1, -1)
        raw = struct.pack("<iii", *creds)
    else:
        ints = {SO_TYPE: sock.kind, SO_ERROR: 0, SO_SNDBUF: SOCK_BUF, SO_RCVBUF: SOCK_BUF,
                SO_ACCEPTCONN: int(sock.listening), SO_DOMAIN: AF_UNIX, SO_PROTOCOL: 0}
        if name not in ints:
            raise SyscallError(errno.ENOPROTOOPT)
        raw = struct.pack("<i", ints[name])
    k.mem.write_user(value, raw[:room])
    k.mem.write_user(len_addr, struct.pack("<i", min(room, len(raw))))
    return 0


def sys_setsockopt(k: Kernel, fd: int, level: int, name: int, value: int, length: int, *_: int) -> int:
    _socket(k, fd)
    if level != SOL_SOCKET:
        raise SyscallError(errno.EOPNOTSUPP)
    return 0  # buffer sizes, timeouts, SO_PASSCRED: accepted; queues stay SOCK_BUF


# ---------------------------------------------------------------------------- send and receive
def _destination(k: Kernel, sock: UnixSocket, addr: int, length: int) -> UnixSocket | None:
    if not addr or sock.kind == SOCK_STREAM:
        return None
    target = _bound(k, _read_addr(k, addr, length))
    if target is None:
        raise SyscallError(errno.ECONNREFUSED)
    return target


def sys_sendto(k: Kernel, fd: int, buf: int, size: int, flags: int, addr: int, length: int, *_: int) -> int:
    entry, sock = _socket(k, fd)
    data = k.mem.read_user(buf, min(size, MAX_IO))
    return sock.send(k, entry, data, flags, [], _destination(k, sock, addr, length))


def sys_recvfrom(k: Kernel, fd: int, buf: int, size: int, flags: int, addr: int, len_addr: int, *_: int) -> int:
    entry, sock = _socket(k, fd)
    size = min(size, MAX_IO)
    k.mem.check_user(buf, size, abi.Prot.WRITE)
    data, files, sender, full = sock.receive(k, entry, size, flags)
    _drop(k, files)
    k.mem.write_user(buf, data)
    if addr:
        _write_addr(k, sender, addr, len_addr)
    return full if flags & MSG_TRUNC and sock.kind != SOCK_STREAM else len(data)


def _drop(k: Kernel, files: list[OpenFile]) -> None:
    """Files passed to a receiver that takes no control data lose the message's reference (unix_detach_fds)."""
    holders = k.files.holders
    for file in files:
        others = holders.get(id(file), 1) - 1
        if others > 0:
            holders[id(file)] = others
        else:
            holders.pop(id(file), None)
            file.close()


def _iov(k: Kernel, iov: int, count: int) -> list[tuple[int, int]]:
    if count > 1024:
        raise SyscallError(errno.EMSGSIZE)
    raw = k.mem.read_user(iov, 16 * count) if count else b""
    return [struct.unpack_from("<QQ", raw, 16 * i) for i in range(count)]


def _rights(k: Kernel, control: int, length: int) -> list[OpenFile]:
    """The files of SCM_RIGHTS messages in a control buffer; each holds a reference while in flight."""
    files: list[OpenFile] = []
    raw = k.mem.read_user(control, length) if length else b""
    offset = 0
    while offset + CMSGHDR.size <= len(raw):
        size, level, kind = CMSGHDR.unpack_from(raw, offset)
        if size < CMSGHDR.size or offset + size > len(raw):
            raise SyscallError(errno.EINVAL)
        if level == SOL_SOCKET and kind == SCM_RIGHTS:
            count = (size - CMSGHDR.size) // 4
            for fd in struct.unpack_from(f"<{count}i", raw, offset + CMSGHDR.size):
                files.append(k.files.get(fd).file)
        elif level == SOL_SOCKET and kind != SCM_CREDENTIALS:
            raise SyscallError(errno.EINVAL)
        offset += (size + 7) & ~7
    for file in files:
        k.files.holders[id(file)] = k.files.holders.get(id(file), 1) + 1  # the message's reference
    return files


def sys_sendmsg(k: Kernel, fd: int, msg: int, flags: int, *_: int) -> int:
    entry, sock = _socket(k, fd)
    name, namelen, iov, iovlen, control, controllen, _mflags = MSGHDR.unpack(k.mem.read_user(msg, MSGHDR.size))
    data = b"".join(k.mem.read_user(base, length) for base, length in _iov(k, iov, iovlen))
    target = _destination(k, sock, name, namelen)
    files = _rights(k, control, controllen)
    try:
        return sock.send(k, entry, data, flags, files, target)
    except BaseException:
        for file in files:
            k.files.holders[id(file)] -= 1
        raise


def sys_recvmsg(k: Kernel, fd: int, msg: int, flags: int, *_: int) -> int:
    entry, sock = _socket(k, fd)
    name, _namelen, iov, iovlen, control, controllen, _mflags = MSGHDR.unpack(k.mem.read_user(msg, MSGHDR.size))
    vectors = _iov(k, iov, iovlen)
    total = sum(length for _, length in vectors)
    data, files, sender, full = sock.receive(k, entry, min(total, MAX_IO), flags)
    offset = 0
    for base, length in vectors:
        k.mem.write_user(base, data[offset:offset + length])
        offset += length
    out_flags = MSG_TRUNC if full > len(data) and sock.kind != SOCK_STREAM else 0
    used, truncated = _give_rights(k, files, control, controllen, bool(flags & MSG_CMSG_CLOEXEC))
    if truncated:
        out_flags |= MSG_CTRUNC
    if name:
        _write_addr(k, sender, name, msg + 8)
    k.mem.write_user(msg + 40, struct.pack("<Q", used))
    k.mem.write_user(msg + 48, struct.pack("<i", out_flags))
    return full if flags & MSG_TRUNC and sock.kind != SOCK_STREAM else len(data)


def _give_rights(k: Kernel, files: list[OpenFile], control: int, room: int, cloexec: bool) -> tuple[int, bool]:
    """Install passed files as new descriptors and write their SCM_RIGHTS message; (bytes used, truncated)."""
    if not files:
        return 0, False
    fit = max(0, (room - CMSGHDR.size) // 4)
    kept, dropped = files[:fit], files[fit:]
    _drop(k, dropped)
    if not kept:
        return 0, True
    fds = []
    for file in kept:
        if any(e.file is file for e in k.files.entries.values()):
            k.files.holders[id(file)] -= 1  # this table held it already: the message's reference merges
        fds.append(k.files.install(FdEntry(file, abi.O_RDWR, cloexec)))
    size = CMSGHDR.size + 4 * len(fds)
    k.mem.write_user(control, CMSGHDR.pack(size, SOL_SOCKET, SCM_RIGHTS) + struct.pack(f"<{len(fds)}i", *fds))
    return (size + 7) & ~7, bool(dropped)
