"""The file-system half of the fake kernel, driven syscall by syscall through the real entry.

A GuestKernel is a Machine built but not run: every call goes through Kernel.on_syscall
(registers in, -errno out), so the errno boundary and unknown-syscall recording are the
ones a running guest meets.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import struct
from pathlib import Path

import pytest
from conftest import REPO, GuestKernel, run_emulated, run_native, sample

from emu import abi
from emu.abi import AuxType
from emu.kernel import procfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.fs.namei import lookup

AT_FDCWD = abi.AT_FDCWD & 0xFFFFFFFF
O_RDONLY, O_WRONLY, O_RDWR = abi.O_RDONLY, abi.O_WRONLY, abi.O_RDWR
FIXTURE = "fixtures/hello.c"
ST_RDONLY = 1


def _names(records: bytes) -> list[bytes]:
    names, pos = [], 0
    while pos < len(records):
        reclen = struct.unpack_from("<H", records, pos + 16)[0]
        names.append(records[pos + 19 : pos + reclen].split(b"\0", 1)[0])
        pos += reclen
    return names


def _listing(g: GuestKernel, path: str) -> list[bytes]:
    fd = g.open(path, abi.O_DIRECTORY)
    assert fd >= 0
    buf = g.alloc(32768)
    names: list[bytes] = []
    while (n := g("getdents64", fd, buf, 32768)) > 0:
        names += _names(g.read(buf, n))
    assert n == 0 and g("close", fd) == 0
    return names


# ------------------------------------------------------------------------------------ read-only sandbox
@pytest.fixture
def ro() -> GuestKernel:
    """--read-only: no in-memory layer, every write to the file system is EROFS."""
    return GuestKernel(read_only=True)


@pytest.mark.parametrize("flags", [O_WRONLY, O_RDWR, O_WRONLY | abi.O_APPEND, O_RDONLY | abi.O_TRUNC,
                                   O_WRONLY | abi.O_CREAT | abi.O_TRUNC])
def test_opening_an_existing_file_for_writing_is_erofs(ro: GuestKernel, flags: int) -> None:
    assert ro.open(FIXTURE, flags, 0o644) == -errno.EROFS


def test_a_readonly_open_still_works_and_reads_the_file(guest: GuestKernel) -> None:
    assert guest.slurp(FIXTURE) == (REPO / FIXTURE).read_bytes()


def test_o_creat_of_a_missing_file_is_erofs_but_its_parent_must_exist(ro: GuestKernel) -> None:
    assert ro.open("fixtures/new-file", O_WRONLY | abi.O_CREAT, 0o644) == -errno.EROFS
    assert ro.open("fixtures/no-dir/new-file", O_WRONLY | abi.O_CREAT, 0o644) == -errno.ENOENT
    assert ro.open("fixtures/hello.c/x", O_WRONLY | abi.O_CREAT, 0o644) == -errno.ENOTDIR
    assert not (REPO / "fixtures/new-file").exists()


def test_o_excl_on_an_existing_file_is_eexist_before_erofs(ro: GuestKernel) -> None:
    assert ro.open(FIXTURE, O_WRONLY | abi.O_CREAT | abi.O_EXCL, 0o644) == -errno.EEXIST


def test_directories_refuse_writes_with_eisdir(guest: GuestKernel) -> None:
    assert guest.open("fixtures", O_WRONLY) == -errno.EISDIR
    assert guest.open(FIXTURE, abi.O_DIRECTORY) == -errno.ENOTDIR


def test_o_tmpfile_is_erofs_in_a_directory(ro: GuestKernel) -> None:
    assert ro.open("fixtures", O_RDWR | abi.O_TMPFILE, 0o600) == -errno.EROFS


def test_dev_null_is_writable_and_reads_empty(guest: GuestKernel) -> None:
    fd = guest.open("/dev/null", O_RDWR)
    assert fd >= 0
    data = guest.cstr("discarded")
    assert guest("write", fd, data, 9) == 9
    assert guest.read_fd(fd) == b""
    st = guest.alloc(144)
    assert guest("fstat", fd, st) == 0
    mode, = struct.unpack_from("<I", guest.read(st, 144), 24)
    rdev, = struct.unpack_from("<Q", guest.read(st, 144), 40)
    assert stat.S_ISCHR(mode) and (os.major(rdev), os.minor(rdev)) == (1, 3)


def test_dev_full_and_dev_zero(guest: GuestKernel) -> None:
    full = guest.open("/dev/full", O_WRONLY)
    assert guest("write", full, guest.cstr("x"), 1) == -errno.ENOSPC
    zero = guest.open("/dev/zero", O_RDWR)
    assert guest.read_fd(zero, 16) == bytes(16)
    assert guest("write", zero, guest.cstr("x"), 1) == 1


def test_dev_urandom_is_deterministic_by_seed() -> None:
    def first_bytes(seed: int) -> bytes:
        g = GuestKernel(seed=seed)
        return g.read_fd(g.open("/dev/urandom"), 32)

    assert first_bytes(7) == first_bytes(7)
    assert first_bytes(7) != first_bytes(8)


def test_reading_a_write_only_fd_and_writing_a_read_only_one_are_ebadf(guest: GuestKernel) -> None:
    fd = guest.open(FIXTURE)
    assert guest("write", fd, guest.cstr("x"), 1) == -errno.EBADF
    null = guest.open("/dev/null", O_WRONLY)
    assert guest("read", null, guest.alloc(8), 8) == -errno.EBADF


def test_access_w_ok_is_erofs_except_for_devices(ro: GuestKernel) -> None:
    assert ro("access", ro.cstr(FIXTURE), os.W_OK) == -errno.EROFS
    assert ro("access", ro.cstr(FIXTURE), os.R_OK) == 0
    assert ro("access", ro.cstr("/dev/null"), os.W_OK | os.R_OK) == 0
    assert ro("access", ro.cstr(FIXTURE), os.X_OK) == -errno.EACCES
    assert ro("access", ro.cstr(sample("hello_static")), os.X_OK) == 0
    assert ro("access", ro.cstr("fixtures/nope"), os.F_OK) == -errno.ENOENT


def test_changes_to_names_are_refused_like_a_readonly_mount(ro: GuestKernel) -> None:
    assert ro("mkdir", ro.cstr("fixtures/newdir"), 0o755) == -errno.EROFS
    assert ro("mkdir", ro.cstr("fixtures"), 0o755) == -errno.EEXIST
    assert ro("mkdir", ro.cstr("nope/newdir"), 0o755) == -errno.ENOENT
    assert ro("unlink", ro.cstr(FIXTURE)) == -errno.EROFS
    assert ro("unlink", ro.cstr("fixtures/nope")) == -errno.ENOENT
    assert ro("rename", ro.cstr(FIXTURE), ro.cstr("fixtures/x")) == -errno.EROFS
    assert ro("chmod", ro.cstr(FIXTURE), 0o777) == -errno.EROFS
    assert ro("symlink", ro.cstr("x"), ro.cstr("fixtures/newlink")) == -errno.EROFS
    assert ro("truncate", ro.cstr(FIXTURE), 0) == -errno.EROFS
    assert ro("utimensat", AT_FDCWD, ro.cstr(FIXTURE), 0, 0) == -errno.EROFS
    assert ro("setxattr", ro.cstr(FIXTURE), ro.cstr("user.x"), ro.cstr("v"), 1, 0) == -errno.EROFS
    assert (REPO / FIXTURE).stat().st_mode & 0o777 != 0o777


def test_network_sockets_are_eacces_and_unix_ones_exist(guest: GuestKernel) -> None:
    assert guest("socket", 2, 2, 0) == -errno.EACCES  # AF_INET, SOCK_DGRAM
    assert guest("socket", 10, 1, 0) == -errno.EACCES  # AF_INET6, SOCK_STREAM
    assert guest("socket", 1, 1, 0) >= 3  # AF_UNIX, SOCK_STREAM: inside the guest (tests/test_sockets.py)


def test_unknown_syscall_is_enosys_and_recorded(guest: GuestKernel) -> None:
    assert guest(1000) == -errno.ENOSYS
    assert guest(1000) == -errno.ENOSYS
    assert guest(101) == -errno.ENOSYS  # ptrace: not emulated, and never faked
    assert guest.kernel.unknown_syscalls() == {"syscall_0x3e8": 2, "syscall_0x65": 1}
    assert guest("getpid") == 4242
    assert "getpid" not in guest.kernel.unknown_syscalls()


@pytest.mark.skipif(not os.path.exists("/bin/sh"), reason="/bin/sh absent")
def test_a_real_run_that_forks_records_no_unknown_syscall() -> None:
    """dash vforks for an external command (emu/kernel/fork.py): no ENOSYS left on that path."""
    outcome = run_emulated(["/bin/sh", "-c", "/bin/true"], cwd=REPO)
    assert outcome.status == 0 and outcome.err == b""
    assert outcome.result is not None and outcome.result.unknown_syscalls == {}


# ------------------------------------------------------------------------------------- rootfs escapes
@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """A guest root with its own /etc/hostname and symlinks that try to leave it."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("inside\n")
    (root / "dir/deeper").mkdir(parents=True)
    (root / "escape").symlink_to("/")
    (root / "up").symlink_to("../..")
    (root / "dir/deeper/upup").symlink_to("../../../../../..")
    (root / "abs").symlink_to("/etc/hostname")
    (root / "loop").symlink_to("loop")
    (tmp_path / "outside.txt").write_text("outside\n")
    return root


@pytest.mark.parametrize("path", [
    "/escape/etc/hostname", "/up/etc/hostname", "/up/up/up/etc/hostname", "/../../../etc/hostname",
    "/dir/deeper/upup/etc/hostname", "/abs", "etc/../../../etc/hostname", "/escape/escape/up/abs",
])
def test_guest_paths_cannot_leave_the_rootfs(rootfs: Path, path: str) -> None:
    g = GuestKernel(sample("hello_static"), rootfs=str(rootfs), cwd="/")
    assert lookup(g.kernel, AT_FDCWD, path) == "/etc/hostname"
    assert g.kernel.vfs.host_path("/etc/hostname") == str(rootfs / "etc/hostname")
    assert g.slurp(path) == b"inside\n"


def test_rootfs_hides_the_host(rootfs: Path) -> None:
    g = GuestKernel(sample("hello_static"), rootfs=str(rootfs), cwd="/")
    assert g.open("/escape/outside.txt") == -errno.ENOENT
    assert g.open("/up/outside.txt") == -errno.ENOENT
    assert g.open("/bin/sh") == -errno.ENOENT  # the host has one; this root does not
    assert g.open("/loop") == -errno.ELOOP
    assert g.readlink("/escape") == "/"  # the link's own text is unchanged
    with pytest.raises(SyscallError) as err:
        lookup(g.kernel, AT_FDCWD, "/up/../../outside.txt")
    assert err.value.errno == errno.ENOENT


def test_getdents_at_the_rootfs_root_shows_dotdot_as_the_root_itself(rootfs: Path) -> None:
    g = GuestKernel(sample("hello_static"), rootfs=str(rootfs), cwd="/")
    fd = g.open("/", abi.O_DIRECTORY)
    buf = g.alloc(4096)
    n = g("getdents64", fd, buf, 4096)
    records = g.read(buf, n)
    inodes = {}
    pos = 0
    while pos < n:
        ino, _, reclen = struct.unpack_from("<QqH", records, pos)
        inodes[records[pos + 19 : pos + reclen].split(b"\0", 1)[0]] = ino
        pos += reclen
    assert inodes[b".."] == inodes[b"."] == rootfs.stat().st_ino
    assert set(inodes) == {b".", b"..", b"etc", b"dir", b"escape", b"up", b"abs", b"loop"}


# --------------------------------------------------------------------------------------- directories
def test_getdents64_lists_entries_in_the_host_order(guest: GuestKernel) -> None:
    names = _listing(guest, "fixtures")
    assert sorted(names) == sorted([b".", b".."] + [os.fsencode(n) for n in os.listdir(REPO / "fixtures")])
    assert [n for n in names if n not in (b".", b"..")] == [os.fsencode(n) for n in os.listdir(REPO / "fixtures")]


def test_getdents64_too_small_a_buffer_is_einval(guest: GuestKernel) -> None:
    fd = guest.open("fixtures", abi.O_DIRECTORY)
    assert guest("getdents64", fd, guest.alloc(16), 16) == -errno.EINVAL
    assert guest("getdents64", guest.open(FIXTURE), guest.alloc(4096), 4096) == -errno.ENOTDIR


def test_directory_fds_work_as_dirfd_and_for_fchdir(guest: GuestKernel) -> None:
    fd = guest.open("fixtures", abi.O_DIRECTORY)
    inner = guest.open("hello.c", dirfd=fd)
    assert guest.read_fd(inner) == (REPO / FIXTURE).read_bytes()
    assert guest("fchdir", fd) == 0
    assert guest.kernel.vfs.cwd == str(REPO / "fixtures")
    assert guest.open("hello.c") >= 0


# ------------------------------------------------------------------------------------- stat family
def test_statx_passes_the_host_values_through(guest: GuestKernel) -> None:
    buf = guest.alloc(256)
    assert guest("statx", AT_FDCWD, guest.cstr(FIXTURE), abi.AT_SYMLINK_NOFOLLOW, 0x7FF, buf) == 0
    raw = guest.read(buf, 256)
    mask, _, _, nlink, uid, gid, mode = struct.unpack_from("<IIQIIIH", raw, 0)
    ino, size = struct.unpack_from("<QQ", raw, 32)
    mtime_s, = struct.unpack_from("<q", raw, 0x70)
    host = os.stat(REPO / FIXTURE)
    assert mask & 0x7FF == 0x7FF
    assert (ino, size, mode, nlink, uid, gid, mtime_s) == (
        host.st_ino, host.st_size, host.st_mode, host.st_nlink, host.st_uid, host.st_gid, int(host.st_mtime))


def test_newfstatat_and_empty_path(guest: GuestKernel) -> None:
    buf = guest.alloc(144)
    assert guest("newfstatat", AT_FDCWD, guest.cstr("fixtures"), buf, 0) == 0
    ino, = struct.unpack_from("<Q", guest.read(buf, 144), 8)
    assert ino == os.stat(REPO / "fixtures").st_ino
    fd = guest.open(FIXTURE)
    assert guest("newfstatat", fd, guest.cstr(""), buf, abi.AT_EMPTY_PATH) == 0
    size, = struct.unpack_from("<q", guest.read(buf, 144), 48)
    assert size == os.stat(REPO / FIXTURE).st_size
    assert guest("newfstatat", AT_FDCWD, guest.cstr(FIXTURE + "/"), buf, 0) == -errno.ENOTDIR


def test_statfs_is_the_hosts_marked_readonly(ro: GuestKernel) -> None:
    buf = ro.alloc(120)
    assert ro("statfs", ro.cstr("fixtures"), buf) == 0
    f_type, f_bsize = struct.unpack_from("<qq", ro.read(buf, 120), 0)
    f_flags, = struct.unpack_from("<q", ro.read(buf, 120), 88)
    host = os.statvfs(REPO / "fixtures")
    assert f_bsize == host.f_bsize and f_type != 0
    assert f_flags & ST_RDONLY
    assert ro("statfs", ro.cstr("/no/such/dir"), buf) == -errno.ENOENT
    assert ro("statfs", ro.cstr("/proc/self/maps"), buf) == 0
    assert struct.unpack_from("<q", ro.read(buf, 120), 0)[0] == 0x9FA0  # PROC_SUPER_MAGIC


def _host_takes_user_xattrs() -> bool:
    """Can a file in the temporary directory (where tmp_path is) carry a user.* extended attribute?"""
    import tempfile

    with tempfile.NamedTemporaryFile() as probe:
        try:
            os.setxattr(probe.name, "user.emu-probe", b"1")
        except OSError:
            return False
    return True


@pytest.mark.skipif(not _host_takes_user_xattrs(), reason="the host file system refuses user xattrs")
def test_xattrs_read_through_to_the_host(guest: GuestKernel, tmp_path: Path) -> None:
    target = tmp_path / "with-xattr"
    target.write_text("x")
    os.setxattr(target, "user.emu", b"value!")
    path = guest.cstr(str(target))
    name = guest.cstr("user.emu")
    assert guest("getxattr", path, name, 0, 0) == 6  # size 0 asks for the length
    buf = guest.alloc(64)
    assert guest("getxattr", path, name, buf, 3) == -errno.ERANGE
    assert guest("getxattr", path, name, buf, 64) == 6 and guest.read(buf, 6) == b"value!"
    assert guest("lgetxattr", path, guest.cstr("user.none"), buf, 64) == -errno.ENODATA
    n = guest("listxattr", path, buf, 64)
    assert b"user.emu\0" in guest.read(buf, n)


# ----------------------------------------------------------------------------------------- /proc/self
MAPS_LINE = re.compile(
    r"^(?P<start>[0-9a-f]{8,16})-(?P<end>[0-9a-f]{8,16}) [r-][w-][x-][ps] [0-9a-f]{8} [0-9a-f]{2}:[0-9a-f]{2} \d+ "
    r"(?P<pad> *)(?P<name>\S.*)?$"
)


def _check_maps_format(text: str) -> list[re.Match[str]]:
    matches = []
    for line in text.splitlines():
        m = MAPS_LINE.match(line)
        assert m, f"not a maps line: {line!r}"
        if m.group("name"):
            assert m.start("name") == 73, f"name not at column 73: {line!r}"
        else:
            assert m.group("pad") == "", f"padding without a name: {line!r}"
        matches.append(m)
    return matches


def test_maps_format_checker_accepts_the_hosts_own_maps() -> None:
    """Negative control for the regex: it must describe Linux's format, so it is checked on Linux's output."""
    _check_maps_format(Path("/proc/self/maps").read_text())
    with pytest.raises(AssertionError):
        _check_maps_format("00400000-00401000 r-xp 00000000 fe:00 12 /bin/x\n")  # name not padded


def test_proc_self_maps_looks_like_linux(guest: GuestKernel) -> None:
    text = guest.slurp("/proc/self/maps").decode()
    matches = _check_maps_format(text)
    vmas = list(guest.mem)
    gate = (0xFFFFFFFFFF600000, 0xFFFFFFFFFF601000)  # [vsyscall]: shown last, not a VMA of the process
    assert [(int(m["start"], 16), int(m["end"], 16)) for m in matches] == [(v.start, v.end) for v in vmas] + [gate]
    names = [m["name"] for m in matches]
    assert "[stack]" in names
    assert any(n and n.endswith("hello_static") for n in names)


def test_proc_self_maps_of_a_running_guest_has_the_native_shape() -> None:
    """cat /proc/self/maps under emulation and natively: same line format and the same files mapped."""
    native = run_native(["/bin/cat", "/proc/self/maps"], cwd=REPO)
    emulated = run_emulated(["/bin/cat", "/proc/self/maps"], cwd=REPO)
    files = []
    for outcome in (native, emulated):
        matches = _check_maps_format(outcome.out.decode())
        files.append({m["name"] for m in matches if m["name"] and m["name"].startswith("/")})
    assert "/usr/lib/x86_64-linux-gnu/libc.so.6" in files[1]
    assert files[1] - {"/bin/cat"} <= files[0]


def test_readlink_proc_self_exe(guest: GuestKernel) -> None:
    assert guest.readlink("/proc/self/exe") == os.path.realpath(sample("hello_static"))
    assert guest.readlink(f"/proc/{guest.kernel.ident.pid}/exe") == os.path.realpath(sample("hello_static"))
    assert guest.readlink("/proc/self/cwd") == str(REPO)
    assert guest.readlink("/proc/self") == str(guest.kernel.ident.pid)
    assert guest.readlink("/proc/self/fd/1") == "pipe:[11]"


def test_proc_self_exe_opens_the_executable(guest: GuestKernel) -> None:
    assert guest.slurp("/proc/self/exe")[:4] == b"\x7fELF"


def test_proc_self_auxv_is_the_auxv_on_the_stack(guest: GuestKernel) -> None:
    sp = guest.machine.entry_sp
    argc, = struct.unpack("<Q", guest.read(sp, 8))
    pos = sp + 8 * (argc + 2)
    while struct.unpack("<Q", guest.read(pos, 8))[0]:
        pos += 8
    pos += 8
    stacked = b""
    while True:
        pair = guest.read(pos, 16)
        stacked += pair
        pos += 16
        if struct.unpack("<Q", pair[:8])[0] == AuxType.AT_NULL:
            break
    auxv = guest.slurp("/proc/self/auxv")
    assert auxv == stacked
    keys = [struct.unpack_from("<Q", auxv, i)[0] for i in range(0, len(auxv), 16)]
    assert AuxType.AT_RANDOM in keys and AuxType.AT_PHDR in keys and keys[-1] == AuxType.AT_NULL


def test_proc_self_cmdline_environ_comm_status() -> None:
    g = GuestKernel(sample("hello_static"), ["hello", "a b"], {"K": "V"})
    assert g.slurp("/proc/self/cmdline") == b"hello\0a b\0"
    assert g.slurp("/proc/self/environ") == b"K=V\0"
    assert g.slurp("/proc/self/comm") == b"hello_static\n"
    status = g.slurp("/proc/self/status").decode()
    assert "\nPid:\t4242\n" in status and "\nPPid:\t4241\n" in status


def test_proc_self_files_are_not_writable_and_other_pids_are_not_ours(guest: GuestKernel) -> None:
    assert guest.open("/proc/self/maps", O_WRONLY) == -errno.EACCES
    assert guest.open("/proc/self/nonexistent") == -errno.ENOENT
    assert procfs.canonical(guest.kernel, "/proc/1/maps") is None
    assert procfs.canonical(guest.kernel, "/proc/thread-self/maps") == "/proc/4242/maps"


def test_proc_self_fd_lists_the_open_descriptors(guest: GuestKernel) -> None:
    extra = guest.open(FIXTURE)
    names = _listing(guest, "/proc/self/fd")
    assert {b".", b"..", b"0", b"1", b"2", str(extra).encode()} <= set(names)
    assert b"99" not in names
    assert guest.readlink(f"/proc/self/fd/{extra}") == str(REPO / FIXTURE)


def test_dev_stdout_reaches_the_guest_stdout_through_the_magic_link(guest: GuestKernel) -> None:
    fd = guest.open("/dev/stdout", O_WRONLY)
    assert fd >= 3
    assert guest("write", fd, guest.cstr("via magic link\n"), 15) == 15
    assert bytes(guest.io.out) == b"via magic link\n"
    buf = guest.alloc(144)
    assert guest("newfstatat", AT_FDCWD, guest.cstr("/proc/self/fd/1"), buf, 0) == 0
    mode, = struct.unpack_from("<I", guest.read(buf, 144), 24)
    assert stat.S_ISFIFO(mode)
    assert guest("newfstatat", AT_FDCWD, guest.cstr("/proc/self/fd/1"), buf, abi.AT_SYMLINK_NOFOLLOW) == 0
    mode, = struct.unpack_from("<I", guest.read(buf, 144), 24)
    assert stat.S_ISLNK(mode)


def test_host_symlinks_into_proc_self_reach_the_guest_not_the_harness(guest: GuestKernel, tmp_path: Path) -> None:
    """A link to /proc/self/... must resolve to the guest's procfs, never to the harness process's."""
    link = tmp_path / "my-cmdline"
    link.symlink_to("/proc/self/cmdline")
    assert lookup(guest.kernel, AT_FDCWD, str(link)) == "/proc/4242/cmdline"
    assert guest.slurp(str(link)) == os.fsencode(sample("hello_static")) + b"\0"


def test_xattrs_of_procfs_and_pipes_are_what_linux_says(guest: GuestKernel) -> None:
    buf = guest.alloc(64)
    name = guest.cstr("user.x")
    maps = guest.cstr("/proc/self/maps")
    assert guest("getxattr", maps, name, buf, 64) == -errno.EOPNOTSUPP
    assert guest("listxattr", maps, buf, 64) == 0
    assert guest("fgetxattr", 1, name, buf, 64) == -errno.ENODATA  # the captured stdout pipe
    assert guest("flistxattr", 1, buf, 64) == 0
    assert guest("fgetxattr", 77, name, buf, 64) == -errno.EBADF


def test_mount_table_is_the_hosts_read_only(guest: GuestKernel) -> None:
    mounts = guest.slurp("/proc/self/mounts").decode().splitlines()
    host = Path("/proc/self/mounts").read_text().splitlines()
    assert [line.split()[:3] for line in mounts] == [line.split()[:3] for line in host]
    assert all(line.split()[3].startswith("ro") for line in mounts)
    info = guest.slurp("/proc/self/mountinfo").decode()
    assert " / / ro" in info or any(line.split()[4] == "/" and line.split()[5].startswith("ro")
                                    for line in info.splitlines())


def test_mount_table_under_a_rootfs_is_one_read_only_root(rootfs: Path) -> None:
    g = GuestKernel(sample("hello_static"), rootfs=str(rootfs), cwd="/")
    assert g.slurp("/proc/self/mounts") == b"rootfs / rootfs ro 0 0\n"
    # Only /proc/self is the kernel's own; the rest of /proc is whatever the root holds (here: nothing).
    assert g.open("/proc/mounts") == -errno.ENOENT


def test_overlong_names_are_enametoolong_not_a_harness_crash(guest: GuestKernel) -> None:
    assert guest.open("fixtures/" + "a" * 300) == -errno.ENAMETOOLONG
    assert guest.open("/" + "b" * 256 + "/x") == -errno.ENAMETOOLONG
    assert guest.open("/" + "c/" * 2100) == -errno.ENAMETOOLONG  # the whole path is >= PATH_MAX
    assert guest("newfstatat", AT_FDCWD, guest.cstr("d" * 255), guest.alloc(144), 0) == -errno.ENOENT
