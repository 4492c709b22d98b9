"""Pipes as Linux: capacity and F_SETPIPE_SZ, a full pipe, EPIPE with SIGPIPE (one process driven syscall by syscall)."""

from __future__ import annotations

import errno
import struct

import pytest
from conftest import GuestKernel

from emu import abi
from emu.abi import Signal
from emu.kernel.exits import GuestBlocked, GuestKilled
from emu.kernel.pipe import F_GETPIPE_SZ, F_SETPIPE_SZ, PIPE_DEF_SIZE

F_SETFL = 4
SIG_IGN_ACTION = struct.pack("<QQQQ", 1, 0x04000000, 0, 0)  # SIG_IGN, SA_RESTORER


@pytest.fixture
def guest() -> GuestKernel:
    return GuestKernel()


def _pipe(guest: GuestKernel, flags: int = 0) -> tuple[int, int]:
    fds = guest.alloc(8)
    assert guest("pipe2", fds, flags) == 0
    rfd, wfd = struct.unpack("<ii", guest.read(fds, 8))
    return rfd, wfd


def test_capacity_is_64k_and_a_full_nonblocking_pipe_says_eagain(guest: GuestKernel) -> None:
    rfd, wfd = _pipe(guest, abi.O_NONBLOCK)
    assert guest("fcntl", wfd, F_GETPIPE_SZ, 0) == PIPE_DEF_SIZE == 65536
    big = guest.alloc(PIPE_DEF_SIZE + 100)
    assert guest("write", wfd, big, PIPE_DEF_SIZE + 100) == PIPE_DEF_SIZE  # what fits
    assert guest("write", wfd, big, 1) == -errno.EAGAIN
    assert guest("read", rfd, guest.alloc(10), 10) == 10
    assert guest("write", wfd, big, 20) == -errno.EAGAIN  # up to PIPE_BUF bytes go in whole or not at all
    assert guest("write", wfd, big, 5000) == 10  # above PIPE_BUF a short write takes the room left


def test_a_full_blocking_pipe_nobody_else_reads_is_a_deadlock(guest: GuestKernel) -> None:
    _, wfd = _pipe(guest)
    big = guest.alloc(PIPE_DEF_SIZE)
    assert guest("write", wfd, big, PIPE_DEF_SIZE) == PIPE_DEF_SIZE
    with pytest.raises(GuestBlocked):
        guest("write", wfd, big, 1)


def test_setpipe_size_rounds_to_pages_and_refuses_to_drop_data(guest: GuestKernel) -> None:
    rfd, wfd = _pipe(guest)
    assert guest("fcntl", wfd, F_SETPIPE_SZ, 5000) == 8192  # a power of two of pages
    assert guest("fcntl", rfd, F_GETPIPE_SZ, 0) == 8192  # one buffer for both ends
    assert guest("fcntl", rfd, F_SETPIPE_SZ, 1) == 4096
    assert guest("write", wfd, guest.alloc(3000), 3000) == 3000
    assert guest("fcntl", wfd, F_SETPIPE_SZ, 4096) == 4096
    assert guest("fcntl", wfd, F_SETFL, abi.O_WRONLY | abi.O_NONBLOCK) == 0
    assert guest("write", wfd, guest.alloc(2000), 2000) == -errno.EAGAIN  # 3000 + 2000 > one page
    assert guest("fcntl", wfd, F_SETPIPE_SZ, 65536) == 65536
    assert guest("write", wfd, guest.alloc(2000), 2000) == 2000


def test_setpipe_size_below_the_content_is_ebusy_and_a_file_is_ebadf(guest: GuestKernel) -> None:
    rfd, wfd = _pipe(guest)
    assert guest("write", wfd, guest.alloc(9000), 9000) == 9000
    assert guest("fcntl", wfd, F_SETPIPE_SZ, 4096) == -errno.EBUSY
    assert guest("fcntl", 0, F_GETPIPE_SZ, 0) == -errno.EBADF  # stdin here is not a pipe of the kernel's


def test_no_reader_left_is_sigpipe_then_epipe(guest: GuestKernel) -> None:
    rfd, wfd = _pipe(guest)
    assert guest("close", rfd) == 0
    with pytest.raises(GuestKilled) as killed:
        guest("write", wfd, guest.alloc(1), 1)
    assert killed.value.signal is Signal.SIGPIPE
    act = guest.alloc(32, SIG_IGN_ACTION)
    assert guest("rt_sigaction", Signal.SIGPIPE, act, 0, 8) == 0
    assert guest("write", wfd, guest.alloc(1), 1) == -errno.EPIPE  # ignored: the error alone
