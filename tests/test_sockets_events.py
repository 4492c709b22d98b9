"""AF_UNIX sockets, epoll, eventfd, timerfd, close_range, kill and process groups, one syscall at a time."""

from __future__ import annotations

import errno
import os
import struct

import pytest
from conftest import GuestKernel

from emu.abi import Signal
from emu.kernel.exits import GuestKilled

AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, SOCK_DGRAM, SOCK_NONBLOCK = 1, 2, 0o4000
MSG_NOSIGNAL, MSG_TRUNC = 0x4000, 0x20
EPOLLIN, EPOLL_CTL_ADD, EPOLL_CTL_DEL = 1, 1, 2
EFD_SEMAPHORE, EFD_NONBLOCK = 1, 0o4000


@pytest.fixture
def guest() -> GuestKernel:
    return GuestKernel()


def _pair(guest: GuestKernel, kind: int = SOCK_STREAM) -> tuple[int, int]:
    fds = guest.alloc(8)
    assert guest("socketpair", AF_UNIX, kind, 0, fds) == 0
    a, b = struct.unpack("<ii", guest.read(fds, 8))
    return a, b


def _addr(guest: GuestKernel, name: bytes) -> tuple[int, int]:
    raw = struct.pack("<H", AF_UNIX) + name
    return guest.alloc(len(raw), raw), len(raw)


def _recv(guest: GuestKernel, fd: int, size: int = 64, flags: int = 0) -> tuple[int, bytes]:
    buf = guest.alloc(size)
    got = guest("recvfrom", fd, buf, size, flags, 0, 0)
    return got, guest.read(buf, max(got, 0))[:size]


def test_network_families_are_refused_and_unix_streams_carry_bytes(guest: GuestKernel) -> None:
    assert guest("socket", AF_INET, SOCK_STREAM, 0) == -errno.EACCES
    assert guest("socket", AF_INET6, SOCK_DGRAM, 0) == -errno.EACCES
    a, b = _pair(guest)
    assert guest("write", a, guest.cstr("hello"), 5) == 5
    assert guest("sendto", a, guest.cstr("!"), 1, 0, 0, 0) == 1
    assert _recv(guest, b) == (6, b"hello!")  # a stream: one read across both sends


def test_names_of_unnamed_and_bound_sockets_and_enotsock(guest: GuestKernel) -> None:
    a, _ = _pair(guest)
    name, size = guest.alloc(110), guest.alloc(4, struct.pack("<i", 110))
    assert guest("getpeername", a, name, size) == 0
    assert struct.unpack("<i", guest.read(size, 4)) == (2,)  # just the family: unnamed
    fds = guest.alloc(8)
    guest("pipe2", fds, 0)
    rfd = struct.unpack("<i", guest.read(fds, 4))[0]
    assert guest("getpeername", rfd, name, size) == -errno.ENOTSOCK  # bash asks this of stdin
    assert guest("getpeername", 99, name, size) == -errno.EBADF


def test_shutdown_gives_eof_and_a_closed_peer_is_sigpipe(guest: GuestKernel) -> None:
    a, b = _pair(guest)
    assert guest("shutdown", a, 1) == 0  # SHUT_WR
    assert _recv(guest, b) == (0, b"")
    assert guest("close", b) == 0
    assert guest("sendto", a, guest.cstr("x"), 1, MSG_NOSIGNAL, 0, 0) == -errno.EPIPE
    c, d = _pair(guest)
    guest("close", d)
    with pytest.raises(GuestKilled) as killed:
        guest("write", c, guest.cstr("x"), 1)
    assert killed.value.signal is Signal.SIGPIPE


def test_datagrams_keep_their_boundaries(guest: GuestKernel) -> None:
    a, b = _pair(guest, SOCK_DGRAM)
    guest("write", a, guest.cstr("first"), 5)
    guest("write", a, guest.cstr("second"), 6)
    assert _recv(guest, b, 3, MSG_TRUNC) == (5, b"fir")  # the rest of a datagram is dropped
    assert _recv(guest, b) == (6, b"second")


def test_listen_connect_accept_on_names_that_never_reach_the_host(guest: GuestKernel, tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(str(tmp_path), "sock")
    for name in (b"\0abstract-name", path.encode() + b"\0"):
        server = guest("socket", AF_UNIX, SOCK_STREAM, 0)
        addr, size = _addr(guest, name)
        assert guest("bind", server, addr, size) == 0
        assert guest("bind", guest("socket", AF_UNIX, SOCK_STREAM, 0), addr, size) == -errno.EADDRINUSE
        assert guest("listen", server, 5) == 0
        client = guest("socket", AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0)
        assert guest("connect", client, addr, size) == 0
        conn = guest("accept4", server, 0, 0, 0)
        assert conn >= 0
        guest("write", client, guest.cstr("ping"), 4)
        assert _recv(guest, conn) == (4, b"ping")
        assert guest("read", client, guest.alloc(4), 4) == -errno.EAGAIN  # nothing for it yet
    assert not os.path.exists(path)  # the guest's filesystem name is the guest's alone
    nowhere, size = _addr(guest, b"\0nobody-listens")
    assert guest("connect", guest("socket", AF_UNIX, SOCK_STREAM, 0), nowhere, size) == -errno.ECONNREFUSED
    missing, size = _addr(guest, path.encode() + b"-missing\0")
    assert guest("connect", guest("socket", AF_UNIX, SOCK_STREAM, 0), missing, size) == -errno.ENOENT


def test_eventfd_counts_and_semaphore_mode(guest: GuestKernel) -> None:
    efd = guest("eventfd2", 0, EFD_NONBLOCK)
    buf = guest.alloc(8)
    assert guest("read", efd, buf, 8) == -errno.EAGAIN
    assert guest("write", efd, guest.alloc(8, struct.pack("<Q", 3)), 8) == 8
    assert guest("read", efd, buf, 8) == 8 and struct.unpack("<Q", guest.read(buf, 8)) == (3,)
    sem = guest("eventfd2", 2, EFD_SEMAPHORE | EFD_NONBLOCK)
    assert guest("read", sem, buf, 8) == 8 and struct.unpack("<Q", guest.read(buf, 8)) == (1,)
    assert guest("read", sem, buf, 4) == -errno.EINVAL


def test_epoll_reports_readiness_and_refuses_what_cannot_poll(guest: GuestKernel) -> None:
    ep = guest("epoll_create1", 0)
    fds = guest.alloc(8)
    guest("pipe2", fds, 0)
    rfd, wfd = struct.unpack("<ii", guest.read(fds, 8))
    event = guest.alloc(12, struct.pack("<IQ", EPOLLIN, 0xFEED))
    assert guest("epoll_ctl", ep, EPOLL_CTL_ADD, rfd, event) == 0
    assert guest("epoll_ctl", ep, EPOLL_CTL_ADD, rfd, event) == -errno.EEXIST
    out = guest.alloc(12 * 4)
    assert guest("epoll_wait", ep, out, 4, 0) == 0
    guest("write", wfd, guest.cstr("x"), 1)
    assert guest("epoll_wait", ep, out, 4, 0) == 1
    assert struct.unpack("<IQ", guest.read(out, 12)) == (EPOLLIN, 0xFEED)
    assert guest("epoll_ctl", ep, EPOLL_CTL_DEL, rfd, 0) == 0
    assert guest("epoll_ctl", ep, EPOLL_CTL_DEL, rfd, 0) == -errno.ENOENT
    regular = guest.open(__file__)
    assert guest("epoll_ctl", ep, EPOLL_CTL_ADD, regular, event) == -errno.EPERM


def test_timerfd_fires_on_the_virtual_clock(guest: GuestKernel) -> None:
    tfd = guest("timerfd_create", 1, 0o4000)  # CLOCK_MONOTONIC, TFD_NONBLOCK
    spec = guest.alloc(32, struct.pack("<qqqq", 0, 0, 1, 0))  # once, in 1 s
    assert guest("timerfd_settime", tfd, 0, spec, 0) == 0
    buf = guest.alloc(8)
    assert guest("read", tfd, buf, 8) == -errno.EAGAIN
    guest.kernel.clock.advance(10**9)
    assert guest("read", tfd, buf, 8) == 8 and struct.unpack("<Q", guest.read(buf, 8)) == (1,)


def test_close_range_closes_or_marks_close_on_exec(guest: GuestKernel) -> None:
    first = guest("dup", 1)
    second = guest("dup", 1)
    assert guest("close_range", second, second, 4) == 0  # CLOSE_RANGE_CLOEXEC
    assert guest("fcntl", second, 1, 0) == 1  # F_GETFD: FD_CLOEXEC
    assert guest("close_range", first, 0xFFFFFFFF, 0) == 0
    assert guest("fcntl", first, 1, 0) == -errno.EBADF and guest("fcntl", second, 1, 0) == -errno.EBADF
    assert guest("close_range", 5, 4, 0) == -errno.EINVAL


def test_kill_reaches_only_processes_that_exist_and_groups_follow_setpgid(guest: GuestKernel) -> None:
    pid = guest.kernel.ident.pid
    assert guest("kill", 12345, 0) == -errno.ESRCH
    assert guest("kill", pid, 0) == 0
    assert guest("getpgid", 0) == pid and guest("getpgrp") == pid
    assert guest("setpgid", 0, 0) == 0
    assert guest("kill", -pid, 0) == 0 and guest("kill", -(pid + 1), 0) == -errno.ESRCH
    assert guest("alarm", 10) == 0
    guest.kernel.clock.advance(3 * 10**9 + 1)
    assert guest("alarm", 0) == 7  # seconds left, rounded up


def test_signalfd_takes_blocked_pending_signals(guest: GuestKernel) -> None:
    usr1 = 1 << (Signal.SIGUSR1 - 1)
    mask = guest.alloc(8, struct.pack("<Q", usr1))
    assert guest("rt_sigprocmask", 0, mask, 0, 8) == 0  # SIG_BLOCK
    sfd = guest("signalfd4", -1, mask, 8, 0o4000)
    buf = guest.alloc(128)
    assert guest("read", sfd, buf, 128) == -errno.EAGAIN
    assert guest("kill", guest.kernel.ident.pid, Signal.SIGUSR1) == 0  # blocked: stays pending
    assert guest("read", sfd, buf, 64) == -errno.EINVAL  # less than one signalfd_siginfo
    assert guest("read", sfd, buf, 128) == 128
    assert struct.unpack_from("<I", guest.read(buf, 4)) == (Signal.SIGUSR1,)
    assert guest.kernel.signals.pending & usr1 == 0  # taken, not delivered
