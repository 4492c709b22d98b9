"""Descriptors, ioctl/fcntl, pipes, and the process, memory and signal syscalls, one call at a time."""

from __future__ import annotations

import errno
import fcntl as host_fcntl
import os
import resource
import struct
import termios

import pytest
from conftest import REPO, GuestKernel, sample

from emu import abi
from emu.abi import Signal
from emu.guestio import GuestIO
from emu.kernel.exits import GuestBlocked, GuestExit, GuestKilled
from emu.kernel.files import Stream

FIXTURE = "fixtures/hello.c"
F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC = 0, 1, 2, 3, 4, 1030
TCGETS, TIOCGWINSZ, FIONREAD, FIONBIO, FIONCLEX, FIOCLEX = 0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451
O_LARGEFILE = 0o100000


def _int_at(g: GuestKernel, addr: int) -> int:
    return int(struct.unpack("<i", g.read(addr, 4))[0])


# ---------------------------------------------------------------------------------------------- fcntl
def test_f_getfl_shows_what_linux_shows(guest: GuestKernel) -> None:
    """Native x86-64 Linux: O_LARGEFILE forced on, O_CLOEXEC and O_CREAT-style flags dropped."""
    fd = guest.open(FIXTURE, abi.O_RDONLY | abi.O_CLOEXEC)
    assert guest("fcntl", fd, F_GETFL, 0) == O_LARGEFILE
    host = os.open(REPO / FIXTURE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        assert host_fcntl.fcntl(host, F_GETFL) == O_LARGEFILE
    finally:
        os.close(host)
    d = guest.open("fixtures", abi.O_DIRECTORY | abi.O_NOFOLLOW)
    assert guest("fcntl", d, F_GETFL, 0) == abi.O_DIRECTORY | abi.O_NOFOLLOW | O_LARGEFILE
    assert guest("fcntl", 1, F_GETFL, 0) == abi.O_WRONLY  # a pipe: no O_LARGEFILE


def test_cloexec_flags_and_dupfd(guest: GuestKernel) -> None:
    fd = guest.open(FIXTURE, abi.O_CLOEXEC)
    assert guest("fcntl", fd, F_GETFD, 0) == 1
    assert guest("fcntl", fd, F_SETFD, 0) == 0 and guest("fcntl", fd, F_GETFD, 0) == 0
    assert guest("fcntl", fd, F_DUPFD, 10) == 10
    assert guest("fcntl", fd, F_DUPFD_CLOEXEC, 10) == 11
    assert guest("fcntl", 11, F_GETFD, 0) == 1
    assert guest("fcntl", 99, F_GETFD, 0) == -errno.EBADF


def test_dup2_dup3(guest: GuestKernel) -> None:
    fd = guest.open(FIXTURE)
    data = (REPO / FIXTURE).read_bytes()
    assert guest("dup2", fd, 7) == 7
    assert guest.read_fd(7, 3) == data[:3]
    assert guest.read_fd(fd, 3) == data[3:6]  # one open file: the offset is shared
    assert guest("dup3", fd, fd, 0) == -errno.EINVAL
    assert guest("dup3", fd, 8, abi.O_CLOEXEC) == 8 and guest("fcntl", 8, F_GETFD, 0) == 1
    assert guest("close", 8) == 0 and guest("close", 8) == -errno.EBADF


# ---------------------------------------------------------------------------------------------- ioctl
def test_tty_ioctls_on_a_non_tty_are_enotty(guest: GuestKernel) -> None:
    buf = guest.alloc(64)
    assert guest("ioctl", 1, TCGETS, buf) == -errno.ENOTTY
    assert guest("ioctl", 1, TIOCGWINSZ, buf) == -errno.ENOTTY
    assert guest("ioctl", guest.open(FIXTURE), TCGETS, buf) == -errno.ENOTTY
    assert guest("ioctl", 1, 0x1234, buf) == -errno.ENOTTY
    assert guest("ioctl", 55, TCGETS, buf) == -errno.EBADF


def test_fionbio_and_fioclex_change_the_descriptor(guest: GuestKernel) -> None:
    fd = guest.open(FIXTURE)
    on = guest.alloc(4, struct.pack("<i", 1))
    off = guest.alloc(4, struct.pack("<i", 0))
    assert guest("ioctl", fd, FIONBIO, on) == 0
    assert guest("fcntl", fd, F_GETFL, 0) & abi.O_NONBLOCK
    assert guest("ioctl", fd, FIONBIO, off) == 0
    assert not guest("fcntl", fd, F_GETFL, 0) & abi.O_NONBLOCK
    assert guest("ioctl", fd, FIOCLEX, 0) == 0 and guest("fcntl", fd, F_GETFD, 0) == 1
    assert guest("ioctl", fd, FIONCLEX, 0) == 0 and guest("fcntl", fd, F_GETFD, 0) == 0


def test_fionread_counts_what_is_left(guest: GuestKernel) -> None:
    fd = guest.open(FIXTURE)
    out = guest.alloc(4)
    guest.read_fd(fd, 10)
    assert guest("ioctl", fd, FIONREAD, out) == 0
    assert _int_at(guest, out) == (REPO / FIXTURE).stat().st_size - 10


def test_terminal_queries_pass_through_to_a_real_tty() -> None:
    master, slave = os.openpty()
    try:
        host_fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("<HHHH", 33, 111, 0, 0))
        g = GuestKernel()
        g.kernel.files.entries[1].file = Stream(writer=lambda b: len(b), host=slave, guest_path="/dev/pts/x")
        buf = g.alloc(64)
        assert g("ioctl", 1, TIOCGWINSZ, buf) == 0
        assert struct.unpack("<HH", g.read(buf, 4)) == (33, 111)
        assert g("ioctl", 1, TCGETS, buf) == 0
    finally:
        os.close(master)
        os.close(slave)


# ---------------------------------------------------------------------------------------------- pipes
def test_pipe_round_trip_and_empty_read(guest: GuestKernel) -> None:
    fds = guest.alloc(8)
    assert guest("pipe2", fds, abi.O_CLOEXEC) == 0
    rfd, wfd = struct.unpack("<ii", guest.read(fds, 8))
    assert guest("write", wfd, guest.cstr("abc"), 3) == 3
    count = guest.alloc(4)
    assert guest("ioctl", rfd, FIONREAD, count) == 0 and _int_at(guest, count) == 3
    assert guest.read_fd(rfd) == b"abc"
    with pytest.raises(GuestBlocked):  # nothing else runs to fill it: Linux would sleep forever
        guest("read", rfd, guest.alloc(4), 4)
    assert guest("fcntl", rfd, 4, abi.O_NONBLOCK) == 0  # F_SETFL
    assert guest("read", rfd, guest.alloc(4), 4) == -errno.EAGAIN
    assert guest("lseek", rfd, 0, 0) == -errno.ESPIPE
    assert guest("fadvise64", rfd, 0, 0, 2) == -errno.ESPIPE
    assert guest("fsync", wfd) == -errno.EINVAL
    assert guest("close", wfd) == 0
    assert guest("read", rfd, guest.alloc(4), 4) == 0  # EOF once the writer is gone


def test_fadvise_and_fsync_on_a_file(guest: GuestKernel) -> None:
    fd = guest.open(FIXTURE)
    assert guest("fadvise64", fd, 0, 0, 2) == 0  # POSIX_FADV_SEQUENTIAL
    assert guest("fadvise64", fd, 0, 0, 99) == -errno.EINVAL
    assert guest("fsync", fd) == 0


def test_directory_offsets_are_the_hosts_and_rewind_works(guest: GuestKernel) -> None:
    fd = guest.open("fixtures", abi.O_DIRECTORY)
    buf = guest.alloc(65536)
    first = guest("getdents64", fd, buf, 65536)
    listing = guest.read(buf, first)
    assert first > 0 and guest("getdents64", fd, buf, 65536) == 0
    assert guest("lseek", fd, 0, 0) == 0
    assert guest("getdents64", fd, buf, 65536) == first
    assert guest.read(buf, first) == listing


# -------------------------------------------------------------------------------------------- process
def test_identity_is_the_configured_one() -> None:
    g = GuestKernel(pid=777, ppid=776)
    assert (g("getpid"), g("getppid"), g("gettid")) == (777, 776, 777)
    assert g("getuid") == os.getuid() and g("getgid") == os.getgid()


def test_uname_is_deterministic(guest: GuestKernel) -> None:
    buf = guest.alloc(390)
    assert guest("uname", buf) == 0
    fields = [guest.read(buf + 65 * i, 65).split(b"\0", 1)[0] for i in range(6)]
    assert fields[0] == b"Linux" and fields[1] == b"uprobe-emu" and fields[4] == b"x86_64"


def test_getrandom_is_seeded() -> None:
    def draw(seed: int) -> bytes:
        g = GuestKernel(seed=seed)
        buf = g.alloc(16)
        assert g("getrandom", buf, 16, 1) == 16
        return g.read(buf, 16)

    assert draw(1) == draw(1) != draw(2)


def test_clock_is_virtual_and_monotonic() -> None:
    g = GuestKernel(realtime_start_ns=1_000_000_000 * 10**9)
    ts = g.alloc(16)
    assert g("clock_gettime", 0, ts) == 0
    sec, _ = struct.unpack("<qq", g.read(ts, 16))
    assert sec == 1_000_000_000
    readings = []
    for _ in range(3):
        assert g("clock_gettime", 1, ts) == 0
        sec, nsec = struct.unpack("<qq", g.read(ts, 16))
        readings.append(sec * 10**9 + nsec)
    assert readings == sorted(readings) and len(set(readings)) == 3
    assert g("clock_gettime", 99, ts) == -errno.EINVAL


def test_prlimit_get_and_lower(guest: GuestKernel) -> None:
    old = guest.alloc(16)
    assert guest("prlimit64", 0, 7, 0, old) == 0  # RLIMIT_NOFILE
    assert struct.unpack("<QQ", guest.read(old, 16)) == resource.getrlimit(resource.RLIMIT_NOFILE)  # the host's
    new = guest.alloc(16, struct.pack("<QQ", 256, 512))
    assert guest("prlimit64", 0, 7, new, 0) == 0
    assert guest("prlimit64", 0, 7, 0, old) == 0 and struct.unpack("<QQ", guest.read(old, 16)) == (256, 512)
    raise_hard = guest.alloc(16, struct.pack("<QQ", 256, 513))
    assert guest("prlimit64", 0, 7, raise_hard, 0) == -errno.EPERM


def test_exit_group_ends_with_the_status(guest: GuestKernel) -> None:
    with pytest.raises(GuestExit) as ended:
        guest("exit_group", 300)
    assert ended.value.status == 300 & 0xFF


# --------------------------------------------------------------------------------------------- memory
def test_mmap_anonymous_and_file(guest: GuestKernel) -> None:
    anon = guest("mmap", 0, 8192, 3, abi.MAP_PRIVATE | abi.MAP_ANONYMOUS, 0xFFFFFFFF, 0)
    assert anon > 0 and anon % 4096 == 0
    assert guest.read(anon, 16) == bytes(16)
    fd = guest.open(FIXTURE)
    mapped = guest("mmap", 0, 4096, 1, abi.MAP_PRIVATE, fd, 0)
    data = (REPO / FIXTURE).read_bytes()
    assert guest.read(mapped, len(data)) == data
    vma = guest.mem.find(mapped)
    assert vma is not None and vma.name == str(REPO / FIXTURE) and vma.inode == (REPO / FIXTURE).stat().st_ino
    assert guest("mmap", 0, 4096, 3, abi.MAP_SHARED, fd, 0) == -errno.EACCES  # shared+writable: read-only files
    assert guest("munmap", anon, 8192) == 0 and guest.mem.find(anon) is None


def test_brk_grows_and_reports(guest: GuestKernel) -> None:
    start = guest("brk", 0)
    assert guest("brk", start + 0x5000) == start + 0x5000
    assert guest.mem.find(start + 0x4000) is not None
    assert guest("brk", start - 0x100000) == start + 0x5000  # refused: the current break


# -------------------------------------------------------------------------------------------- signals
def test_sigaction_round_trip_and_self_kill(guest: GuestKernel) -> None:
    ign = guest.alloc(32, struct.pack("<QQQQ", 1, 0, 0, 0))  # SIG_IGN
    assert guest("rt_sigaction", Signal.SIGTERM, ign, 0, 8) == 0
    old = guest.alloc(32)
    assert guest("rt_sigaction", Signal.SIGTERM, 0, old, 8) == 0
    assert struct.unpack("<Q", guest.read(old, 8))[0] == 1
    assert guest("kill", guest("getpid"), Signal.SIGTERM) == 0  # ignored
    assert guest("rt_sigaction", Signal.SIGKILL, ign, 0, 8) == -errno.EINVAL
    with pytest.raises(GuestKilled) as killed:
        guest("kill", guest("getpid"), Signal.SIGUSR1)
    assert killed.value.signal is Signal.SIGUSR1


def test_a_blocked_signal_waits_for_the_unblock(guest: GuestKernel) -> None:
    mask = guest.alloc(8, struct.pack("<Q", 1 << (Signal.SIGINT - 1)))
    assert guest("rt_sigprocmask", 0, mask, 0, 8) == 0  # SIG_BLOCK
    assert guest("tgkill", 4242, 4242, Signal.SIGINT) == 0  # pending
    with pytest.raises(GuestKilled) as killed:
        guest("rt_sigprocmask", 1, mask, 0, 8)  # SIG_UNBLOCK delivers it
    assert killed.value.signal is Signal.SIGINT


def test_captured_io_is_what_the_guest_wrote() -> None:
    io = GuestIO.captured(b"input")
    g = GuestKernel(sample("hello_static"))
    g.kernel.files.entries[0].file = io.stdin
    g.kernel.files.entries[2].file = io.stderr
    assert g.read_fd(0, 100) == b"input"
    assert g("write", 2, g.cstr("to stderr"), 9) == 9
    assert bytes(io.err) == b"to stderr"


# ----------------------------------------------------------------------------------------------- poll
POLLIN, POLLOUT, POLLHUP, POLLNVAL = 0x1, 0x4, 0x10, 0x20


def _pollfds(g: GuestKernel, *pairs: tuple[int, int]) -> int:
    return g.alloc(8 * len(pairs), b"".join(struct.pack("<ihh", fd, ev, 0) for fd, ev in pairs))


def _revents(g: GuestKernel, addr: int, n: int) -> list[int]:
    return [struct.unpack_from("<ihh", g.read(addr, 8 * n), 8 * i)[2] for i in range(n)]


def test_poll_reports_readiness_now(guest: GuestKernel) -> None:
    fds = guest.alloc(8)
    assert guest("pipe2", fds, 0) == 0
    rfd, wfd = struct.unpack("<ii", guest.read(fds, 8))
    file_fd = guest.open(FIXTURE)
    polls = _pollfds(guest, (rfd, POLLIN), (wfd, POLLOUT), (file_fd, POLLIN | POLLOUT), (99, POLLIN), (-1, POLLIN))
    assert guest("poll", polls, 5, 0) == 3  # the empty pipe is not ready; the bad fd counts (POLLNVAL)
    assert _revents(guest, polls, 5) == [0, POLLOUT, POLLIN | POLLOUT, POLLNVAL, 0]
    guest("write", wfd, guest.cstr("x"), 1)
    guest("close", wfd)
    polls = _pollfds(guest, (rfd, POLLIN))
    assert guest("poll", polls, 1, -1) == 1
    assert _revents(guest, polls, 1) == [POLLIN | POLLHUP]


def test_poll_timeout_advances_the_virtual_clock_and_forever_is_blocked(guest: GuestKernel) -> None:
    from emu.kernel.exits import GuestBlocked

    before = guest.kernel.clock.now(realtime=False)
    assert guest("poll", 0, 0, 1500) == 0  # poll(NULL, 0, 1500): a sleep
    assert guest.kernel.clock.now(realtime=False) - before >= 1_500_000_000
    tmo = guest.alloc(16, struct.pack("<qq", 0, 5))
    assert guest("ppoll", 0, 0, tmo, 0, 8) == 0
    fds = guest.alloc(8)
    guest("pipe2", fds, 0)
    rfd, _ = struct.unpack("<ii", guest.read(fds, 8))
    with pytest.raises(GuestBlocked):
        guest("poll", _pollfds(guest, (rfd, POLLIN)), 1, -1)


# ------------------------------------------------------------------------------------- sysinfo, groups
def test_sysinfo_layout_has_mem_unit_where_glibc_reads_it(guest: GuestKernel) -> None:
    buf = guest.alloc(112, b"\xff" * 112)
    assert guest("sysinfo", buf) == 0
    raw = guest.read(buf, 112)
    totalram, freeram = struct.unpack_from("<QQ", raw, 32)
    procs, = struct.unpack_from("<H", raw, 80)
    mem_unit, = struct.unpack_from("<I", raw, 104)
    assert (totalram, freeram, procs, mem_unit) == (4 << 30, 2 << 30, 1, 1)


def test_getgroups_size_protocol(guest: GuestKernel) -> None:
    n = guest("getgroups", 0, 0)
    assert n == len(os.getgroups())
    buf = guest.alloc(4 * 64)
    assert guest("getgroups", 64, buf) == n
    assert list(struct.unpack(f"<{n}I", guest.read(buf, 4 * n))) == os.getgroups()
    other = GuestKernel(uid=os.getuid() + 1)
    assert other("getgroups", 0, 0) == 0


def test_a_real_tty_is_never_changed_and_its_pgrp_is_the_guests() -> None:
    master, slave = os.openpty()
    try:
        before = termios.tcgetattr(slave)
        g = GuestKernel()
        g.kernel.files.entries[0].file = Stream(reader=lambda n: b"", host=slave, guest_path="/dev/pts/x")
        buf = g.alloc(64)
        assert g("ioctl", 0, TCGETS, buf) == 0
        raw = bytearray(g.read(buf, 36))
        raw[12:16] = b"\0\0\0\0"  # c_lflag = 0: raw mode
        g.mem.write(buf, bytes(raw))
        assert g("ioctl", 0, 0x5402, buf) == -errno.EPERM  # TCSETS
        assert termios.tcgetattr(slave) == before
        assert g("ioctl", 0, 0x540F, buf) == 0 and _int_at(g, buf) == 4242  # TIOCGPGRP
        assert g("ioctl", 0, 0x1234, buf) == -errno.ENOTTY
    finally:
        os.close(master)
        os.close(slave)


def test_ulimit_prints_what_it_prints_natively() -> None:
    """Every limit but the stack's (which the layout is computed from) is the host's, as a child inherits it."""
    from conftest import run_emulated, run_native

    native = run_native(["/bin/bash", "-c", "ulimit -a"], env={})
    emulated = run_emulated(["/bin/bash", "-c", "ulimit -a"], env={})
    assert native.status == emulated.status == 0
    assert b"max user processes" in native.out

    def lines(out: bytes) -> list[bytes]:
        same_stack = resource.getrlimit(resource.RLIMIT_STACK)[0] == 8 << 20
        return [line for line in out.splitlines() if same_stack or b"stack size" not in line]

    assert lines(emulated.out) == lines(native.out)
