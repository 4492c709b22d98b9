"""The guest's writable file system: an in-memory layer over the host tree, which stays untouched.

Call-level tests drive the kernel syscall by syscall (GuestKernel); whole-program tests run
Debian's bash and python3.11 under emulation and natively, in separate temp dirs, and compare.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path

from conftest import REPO, GuestKernel, run_emulated, run_native

from emu import abi

AT_FDCWD = abi.AT_FDCWD & 0xFFFFFFFF
O_RDONLY, O_WRONLY, O_RDWR, O_CREAT, O_EXCL = abi.O_RDONLY, abi.O_WRONLY, abi.O_RDWR, abi.O_CREAT, abi.O_EXCL
PROT_RW = abi.Prot.READ | abi.Prot.WRITE
TMPFS_MAGIC, ST_RDONLY = 0x01021994, 1
BASH, PYTHON = "/bin/bash", "/usr/bin/python3.11"


def tree_digest(root: Path) -> str:
    """Names, types, modes, sizes, mtimes, contents and link targets of everything under ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            st = path.lstat()
            h.update(f"{path.relative_to(root)}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                h.update(path.read_bytes())
    return h.hexdigest()


def _host_tree(root: Path) -> Path:
    (root / "a" / "sub").mkdir(parents=True)
    (root / "a" / "one.txt").write_text("one\n")
    (root / "a" / "sub" / "two.txt").write_text("two\n")
    (root / "gone.txt").write_text("remove me\n")
    (root / "empty").mkdir()
    (root / "link").symlink_to("a/one.txt")
    return root


def _g(tmp_path: Path, **opts: object) -> GuestKernel:
    return GuestKernel(cwd=str(tmp_path), **opts)  # type: ignore[arg-type]


def _fstat(g: GuestKernel, fd: int) -> tuple[int, int, int]:
    """(st_mode, st_nlink, st_size) of a descriptor."""
    buf = g.alloc(144)
    assert g("fstat", fd, buf) == 0
    raw = g.read(buf, 144)
    return struct.unpack_from("<I", raw, 24)[0], struct.unpack_from("<Q", raw, 16)[0], struct.unpack_from("<q", raw, 48)[0]


def _stat(g: GuestKernel, path: str) -> tuple[int, int, int] | int:
    buf = g.alloc(144)
    ret = g("lstat", g.cstr(path), buf)
    if ret < 0:
        return ret
    raw = g.read(buf, 144)
    return struct.unpack_from("<I", raw, 24)[0], struct.unpack_from("<Q", raw, 16)[0], struct.unpack_from("<q", raw, 48)[0]


def _write(g: GuestKernel, fd: int, data: bytes) -> int:
    return g("write", fd, g.alloc(len(data), data), len(data))


def _names(g: GuestKernel, path: str) -> set[bytes]:
    fd = g.open(path, abi.O_DIRECTORY)
    assert fd >= 0
    buf, names = g.alloc(32768), set()
    while (n := g("getdents64", fd, buf, 32768)) > 0:
        raw, pos = g.read(buf, n), 0
        while pos < n:
            reclen = struct.unpack_from("<H", raw, pos + 16)[0]
            names.add(raw[pos + 19 : pos + reclen].split(b"\0", 1)[0])
            pos += reclen
    assert g("close", fd) == 0
    return names - {b".", b".."}


# ------------------------------------------------------------------------------------ the digest itself
def test_tree_digest_sees_a_changed_byte_a_rename_and_an_mtime(tmp_path: Path) -> None:
    root = _host_tree(tmp_path / "t")
    before = tree_digest(root)
    assert tree_digest(root) == before
    (root / "a" / "one.txt").write_text("onE\n")
    assert tree_digest(root) != before
    changed = tree_digest(root)
    (root / "gone.txt").rename(root / "gone2.txt")
    assert tree_digest(root) != changed
    renamed = tree_digest(root)
    os.utime(root / "gone2.txt", ns=(0, 0))
    assert tree_digest(root) != renamed


# ------------------------------------------------------------------------------------ call by call
def test_created_files_read_back_and_never_reach_the_host(tmp_path: Path) -> None:
    g = _g(tmp_path)
    fd = g.open("new.txt", O_WRONLY | O_CREAT | O_EXCL, 0o640)
    assert fd >= 0 and _write(g, fd, b"hello ") == 6 and _write(g, fd, b"world") == 5
    assert g("close", fd) == 0
    assert g.slurp("new.txt") == b"hello world"
    mode, nlink, size = _stat(g, "new.txt")  # type: ignore[misc]
    assert stat.S_ISREG(mode) and mode & 0o777 == 0o640 & ~0o022 and nlink == 1 and size == 11
    assert g.open("new.txt", O_WRONLY | O_CREAT | O_EXCL, 0o600) == -errno.EEXIST
    assert not (tmp_path / "new.txt").exists()
    assert b"new.txt" in _names(g, ".")


def test_a_host_file_opened_for_writing_is_copied_and_the_host_keeps_its_bytes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"0123456789")
    g = _g(tmp_path)
    fd = g.open("f", O_RDWR)
    assert fd >= 0
    assert g("pwrite64", fd, g.alloc(2, b"AB"), 2, 4) == 2
    buf = g.alloc(16)
    assert g("pread64", fd, buf, 16, 0) == 10 and g.read(buf, 10) == b"0123AB6789"
    assert g("ftruncate", fd, 3) == 0 and _fstat(g, fd)[2] == 3
    assert g("truncate", g.cstr("f"), 6) == 0 and g.slurp("f") == b"012\0\0\0"
    assert (tmp_path / "f").read_bytes() == b"0123456789"


def test_o_trunc_and_o_append(tmp_path: Path) -> None:
    (tmp_path / "log").write_bytes(b"old")
    g = _g(tmp_path)
    fd = g.open("log", O_WRONLY | abi.O_APPEND)
    assert g("lseek", fd, 0, os.SEEK_SET) == 0 and _write(g, fd, b"+new") == 4
    assert g.slurp("log") == b"old+new"
    assert g.open("log", O_WRONLY | abi.O_TRUNC) >= 0 and g.slurp("log") == b""


def test_unlink_hides_the_name_but_an_open_descriptor_keeps_the_file(tmp_path: Path) -> None:
    (tmp_path / "gone").write_bytes(b"still here")
    g = _g(tmp_path)
    fd = g.open("gone")
    mine = g.open("mine", O_RDWR | O_CREAT, 0o600)
    assert _write(g, mine, b"mine") == 4
    assert g("unlink", g.cstr("gone")) == 0 and g("unlink", g.cstr("mine")) == 0
    assert _stat(g, "gone") == -errno.ENOENT and g.open("gone") == -errno.ENOENT
    assert g("unlink", g.cstr("gone")) == -errno.ENOENT
    assert g.read_fd(fd) == b"still here"
    assert g("lseek", mine, 0, os.SEEK_SET) == 0 and g.read_fd(mine) == b"mine" and _fstat(g, mine)[1] == 0
    assert {b"gone", b"mine"}.isdisjoint(_names(g, "."))
    assert (tmp_path / "gone").read_bytes() == b"still here"


def test_directories_mkdir_rmdir_and_their_errors(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    g = _g(tmp_path)
    assert g("mkdir", g.cstr("d"), 0o755) == 0 and g("mkdir", g.cstr("d"), 0o755) == -errno.EEXIST
    assert g("mkdir", g.cstr("d/e"), 0o700) == 0 and g("mkdir", g.cstr("nope/e"), 0o700) == -errno.ENOENT
    assert g("rmdir", g.cstr("d")) == -errno.ENOTEMPTY and g("rmdir", g.cstr("full")) == -errno.ENOTEMPTY
    assert g("unlink", g.cstr("d")) == -errno.EISDIR
    assert g("rmdir", g.cstr("d/e")) == 0 and g("rmdir", g.cstr("d")) == 0
    assert g("unlink", g.cstr("full/x")) == 0 and g("rmdir", g.cstr("full")) == 0
    assert _stat(g, "full") == -errno.ENOENT and g("rmdir", g.cstr("full")) == -errno.ENOENT
    assert (tmp_path / "full" / "x").exists()


def test_rename_moves_a_host_directory_with_its_content_and_replaces_files(tmp_path: Path) -> None:
    root = _host_tree(tmp_path / "t")
    before = tree_digest(root)
    g = _g(root)
    assert g("rename", g.cstr("a"), g.cstr("b")) == 0
    assert g.slurp("b/sub/two.txt") == b"two\n" and _stat(g, "a") == -errno.ENOENT
    assert _names(g, "b") == {b"one.txt", b"sub"}
    assert g("rename", g.cstr("b/one.txt"), g.cstr("b/sub/two.txt")) == 0
    assert g.slurp("b/sub/two.txt") == b"one\n" and _names(g, "b/sub") == {b"two.txt"}
    assert g("rename", g.cstr("b"), g.cstr("b/sub/inside")) == -errno.EINVAL
    assert g("rename", g.cstr("empty"), g.cstr("gone.txt")) == -errno.ENOTDIR
    assert g("rename", g.cstr("gone.txt"), g.cstr("empty")) == -errno.EISDIR
    assert g("rename", g.cstr("empty"), g.cstr("b")) == -errno.ENOTEMPTY
    assert g("renameat2", AT_FDCWD, g.cstr("gone.txt"), AT_FDCWD, g.cstr("link"), 1) == -errno.EEXIST
    assert g("renameat2", AT_FDCWD, g.cstr("gone.txt"), AT_FDCWD, g.cstr("b/sub/two.txt"), 2) == 0  # EXCHANGE
    assert g.slurp("gone.txt") == b"one\n" and g.slurp("b/sub/two.txt") == b"remove me\n"
    assert tree_digest(root) == before


def test_links_symlinks_chmod_and_times(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("data")
    g = _g(tmp_path)
    assert g("link", g.cstr("f"), g.cstr("hard")) == 0
    assert _stat(g, "f")[1] == 2  # type: ignore[index]
    fd = g.open("hard", O_WRONLY | abi.O_APPEND)
    assert _write(g, fd, b"!") == 1 and g.slurp("f") == b"data!"
    assert g("symlink", g.cstr("f"), g.cstr("soft")) == 0 and g.readlink("soft") == "f"
    assert g.slurp("soft") == b"data!"
    assert g("chmod", g.cstr("f"), 0o600) == 0 and _stat(g, "hard")[0] & 0o7777 == 0o600  # type: ignore[index]
    assert g("utimensat", AT_FDCWD, g.cstr("f"), g.alloc(32, struct.pack("<qqqq", 5, 0, 7, 0)), 0) == 0
    buf = g.alloc(144)
    assert g("stat", g.cstr("f"), buf) == 0 and struct.unpack_from("<q", g.read(buf, 144), 88)[0] == 7
    assert (tmp_path / "f").stat().st_mode & 0o777 != 0o600 or (tmp_path / "f").read_text() == "data"
    assert (tmp_path / "f").read_text() == "data" and not (tmp_path / "hard").exists()


def test_o_tmpfile_is_nameless_until_linkat(tmp_path: Path) -> None:
    g = _g(tmp_path)
    fd = g.open(".", O_RDWR | abi.O_TMPFILE, 0o600)
    assert fd >= 0 and _write(g, fd, b"tmp") == 3 and _fstat(g, fd)[1] == 0
    assert _names(g, ".") == set()
    assert g.open(".", O_RDONLY | abi.O_TMPFILE, 0o600) == -errno.EINVAL
    assert g("linkat", fd, g.cstr(""), AT_FDCWD, g.cstr("named"), abi.AT_EMPTY_PATH) == 0
    assert g.slurp("named") == b"tmp" and _fstat(g, fd)[1] == 1


def test_tmp_and_dev_shm_are_tmpfs_and_the_rest_is_writable(tmp_path: Path) -> None:
    g = _g(tmp_path)
    buf = g.alloc(120)
    assert g("statfs", g.cstr("/dev/shm"), buf) == 0
    assert struct.unpack_from("<q", g.read(buf, 120), 0)[0] == TMPFS_MAGIC
    assert g("statfs", g.cstr(str(tmp_path)), buf) == 0
    assert not struct.unpack_from("<q", g.read(buf, 120), 88)[0] & ST_RDONLY
    fd = g.open("/dev/shm/sem.test", O_RDWR | O_CREAT, 0o600)
    buf = g.alloc(144)
    assert g("fstat", fd, buf) == 0 and struct.unpack_from("<Q", g.read(buf, 144), 0)[0] == os.stat("/dev/shm").st_dev
    assert g("access", g.cstr(str(tmp_path)), os.W_OK) == 0
    assert not Path("/dev/shm/sem.test").exists()


def test_mknod_makes_files_and_fifos_but_no_device_nodes(tmp_path: Path) -> None:
    g = _g(tmp_path)
    assert g("mknod", g.cstr("reg"), stat.S_IFREG | 0o644, 0) == 0
    assert g("mknod", g.cstr("fifo"), stat.S_IFIFO | 0o644, 0) == 0
    assert g("mknod", g.cstr("null"), stat.S_IFCHR | 0o644, os.makedev(1, 3)) == -errno.EPERM
    assert g("mknod", g.cstr("reg"), stat.S_IFREG | 0o644, 0) == -errno.EEXIST
    assert g("mknod", g.cstr("dir"), stat.S_IFDIR | 0o755, 0) == -errno.EINVAL
    assert stat.S_ISREG(_stat(g, "reg")[0]) and stat.S_ISFIFO(_stat(g, "fifo")[0])  # type: ignore[index]
    assert _stat(g, "null") == -errno.ENOENT
    assert not (tmp_path / "reg").exists()
    ro = GuestKernel(cwd=str(tmp_path), read_only=True)
    assert ro("mknod", ro.cstr("reg"), stat.S_IFREG | 0o644, 0) == -errno.EROFS


def test_shared_mappings_write_back_to_the_file(tmp_path: Path) -> None:
    g = _g(tmp_path)
    fd = g.open("shm", O_RDWR | O_CREAT, 0o600)
    assert g("ftruncate", fd, 4096) == 0
    addr = g("mmap", 0, 4096, PROT_RW, abi.MAP_SHARED, fd, 0)
    assert addr > 0
    g.mem.write(addr, b"via memory")
    assert g("msync", addr, 4096, 4) == 0  # MS_SYNC
    assert g.slurp("shm")[:10] == b"via memory"
    assert g("pwrite64", fd, g.alloc(3, b"VIA"), 3, 0) == 3 and g.read(addr, 10) == b"VIA memory"
    g.mem.write(addr + 20, b"late")
    assert g("munmap", addr, 4096) == 0
    assert g.slurp("shm")[20:24] == b"late"
    assert g("msync", addr + 1, 4096, 4) == -errno.EINVAL and g("msync", addr, 4096, 5) == -errno.EINVAL
    assert g("msync", addr, 4096, 4) == -errno.ENOMEM  # no longer mapped


def test_mprotect_write_of_a_shared_mapping_of_a_read_only_fd_is_eacces(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(bytes(4096))
    g = _g(tmp_path)
    fd = g.open("f", O_RDONLY)
    shared = g("mmap", 0, 4096, abi.Prot.READ, abi.MAP_SHARED, fd, 0)
    private = g("mmap", 0, 4096, abi.Prot.READ, abi.MAP_PRIVATE, fd, 0)
    assert shared > 0 and private > 0
    assert g("mprotect", shared, 4096, PROT_RW) == -errno.EACCES
    assert g("mprotect", private, 4096, PROT_RW) == 0
    assert g("mprotect", shared, 4096, abi.Prot.READ) == 0


def test_closing_a_locked_host_file_drops_its_lock(tmp_path: Path) -> None:
    """The last close of a description releases its flock (read from the file before it is closed: the
    harness once raised EBADF from its own stat of the closed host fd, and the run died)."""
    (tmp_path / "ro").write_text("x")
    g = _g(tmp_path)
    one = g.open("ro", O_RDONLY)
    assert g("flock", one, 1) == 0 and g("close", one) == 0  # LOCK_SH
    two, three = g.open("ro", O_RDONLY), g.open("ro", O_RDONLY)
    assert g("flock", two, 2 | 4) == 0 and g("flock", three, 2 | 4) == -errno.EWOULDBLOCK
    assert g("close", two) == 0 and g("flock", three, 2 | 4) == 0  # two's lock went with its last close


def test_flock_and_fcntl_locks(tmp_path: Path) -> None:
    (tmp_path / "db").write_text("x")
    g = _g(tmp_path)
    one, two = g.open("db", O_RDWR), g.open("db", O_RDWR)
    assert g("flock", one, 2) == 0 and g("flock", one, 2) == 0  # LOCK_EX again on the same description
    assert g("flock", two, 2 | 4) == -errno.EWOULDBLOCK and g("flock", two, 1 | 4) == -errno.EWOULDBLOCK
    assert g("flock", one, 8) == 0 and g("flock", two, 1 | 4) == 0
    assert g("flock", one, 1 | 4) == 0 and g("flock", one, 2 | 4) == -errno.EWOULDBLOCK
    assert g("flock", one, 16) == -errno.EINVAL
    lock = g.alloc(32, struct.pack("<hh4xqqi4x", 1, 0, 0, 10, 0))  # F_WRLCK bytes 0..9
    assert g("fcntl", one, 6, lock) == 0  # F_SETLK
    assert g("fcntl", two, 5, lock) == 0  # F_GETLK: the same process owns it, no conflict
    assert struct.unpack("<hh4xqqi4x", g.read(lock, 32))[0] == 2  # F_UNLCK
    lock = g.alloc(32, struct.pack("<hh4xqqi4x", 1, 0, 0, 10, 0))
    assert g("fcntl", one, 37, lock) == -errno.EAGAIN  # an OFD lock conflicts with the process's own POSIX lock
    assert g("fcntl", one, 6, g.alloc(32, struct.pack("<hh4xqqi4x", 2, 0, 0, 0, 0))) == 0  # F_UNLCK all
    assert g("fcntl", one, 37, lock) == 0  # F_OFD_SETLK on one description
    assert g("fcntl", two, 37, lock) == -errno.EAGAIN  # and the other's conflicts
    assert g("fcntl", two, 36, lock) == 0 and struct.unpack("<hh4xqqi4x", g.read(lock, 32))[4] == -1
    ro = g.open("db", O_RDONLY)
    assert g("fcntl", ro, 6, g.alloc(32, struct.pack("<hh4xqqi4x", 1, 0, 0, 1, 0))) == -errno.EBADF


def test_close_releases_the_locks_it_should(tmp_path: Path) -> None:
    """As natively: closing the only descriptor of a description drops its flock; closing any
    descriptor of the file drops the process's POSIX locks on it. A lock of a description still
    open elsewhere stays (the control)."""
    (tmp_path / "db").write_text("x")
    g = _g(tmp_path)
    one, two = g.open("db", O_RDWR), g.open("db", O_RDWR)
    copy = g("dup", one)
    assert g("flock", one, 2) == 0 and g("close", one) == 0
    assert g("flock", two, 2 | 4) == -errno.EWOULDBLOCK  # the dup keeps the description and its lock
    assert g("close", copy) == 0 and g("flock", two, 2 | 4) == 0
    assert g("flock", two, 8) == 0
    lock = struct.pack("<hh4xqqi4x", 1, 0, 0, 10, 0)  # F_WRLCK bytes 0..9
    three = g.open("db", O_RDWR)
    assert g("fcntl", three, 6, g.alloc(32, lock)) == 0  # F_SETLK: the process's
    assert g("fcntl", two, 37, g.alloc(32, lock)) == -errno.EAGAIN  # an OFD lock conflicts with it
    assert g("close", three) == 0
    assert g("fcntl", two, 37, g.alloc(32, lock)) == 0  # gone with the close


def test_execve_needs_the_execute_bit_as_natively(tmp_path: Path) -> None:
    script = tmp_path / "noexec.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    argv = [BASH, "-c", "./noexec.sh; echo status=$?; chmod +x noexec.sh; ./noexec.sh"]
    emulated = run_emulated(argv, cwd=tmp_path)
    assert b"Permission denied" in emulated.err and b"status=126" in emulated.out
    assert emulated.observed() == run_native(argv, cwd=tmp_path).observed()


# ------------------------------------------------------------------------------------ whole programs
def _both(argv: list[str], tmp_path: Path, setup: str = "") -> tuple[tuple[bytes, bytes, int], str]:
    """Run natively in one fresh dir and emulated in another; returns the emulated run and
    checks it matches the native one. Returns (observed, digest of the emulated dir after)."""
    native_dir, emu_dir = tmp_path / "native", tmp_path / "emu"
    for d in (native_dir, emu_dir):
        d.mkdir()
        if setup:
            subprocess.run([BASH, "-c", setup], cwd=d, check=True)
    before = tree_digest(emu_dir)
    native = run_native(argv, cwd=native_dir)
    emulated = run_emulated(argv, cwd=emu_dir)
    assert emulated.observed() == native.observed()
    assert tree_digest(emu_dir) == before, "the guest changed the host tree"
    return emulated.observed(), before


def test_bash_redirections_write_read_rename_and_delete(tmp_path: Path) -> None:
    script = ("echo x > f; cat f; echo y >> f; cat f; mkdir d; mv f d/g; ls d; rm keep.txt; ls; "
              "cat keep.txt; chmod 700 d/g; stat -c %a d/g; : > d/g; wc -c < d/g; rm -r d a; ls")
    (out, err, status), _ = _both([BASH, "-c", script], tmp_path, "echo keep > keep.txt; mkdir -p a/b; echo 1 > a/b/c")
    assert out.startswith(b"x\nx\ny\ng\n") and b"No such file" in err


def test_python_tempfile_and_sqlite_on_disk(tmp_path: Path) -> None:
    code = (
        "import os, sqlite3, tempfile\n"
        "with tempfile.NamedTemporaryFile('w+', dir='.', delete=False) as f: f.write('hi'); name = f.name\n"
        "print(open(name).read()); os.unlink(name)\n"
        "with tempfile.TemporaryFile() as t: t.write(b'abc'); t.seek(0); print(t.read())\n"
        "with tempfile.TemporaryDirectory() as d: open(os.path.join(d, 'x'), 'w').write('1'); print(os.listdir(d))\n"
        "db = sqlite3.connect('t.db'); db.execute('create table t(a)'); db.executemany('insert into t values (?)', "
        "[(i,) for i in range(100)]); db.commit(); db.close()\n"
        "db = sqlite3.connect('t.db'); print(db.execute('select count(*), sum(a) from t').fetchone())\n"
        "print(sorted(os.listdir('.')))\n"
    )
    (out, _, status), _ = _both([PYTHON, "-c", code], tmp_path)
    assert status == 0 and b"(100, 4950)" in out and b"['t.db']" in out


def test_multiprocessing_semlock_in_dev_shm(tmp_path: Path) -> None:
    code = ("import multiprocessing as mp\n"
            "lock = mp.Lock(); lock.acquire(); print(lock.acquire(False)); lock.release()\n"
            "sem = mp.Semaphore(3); sem.acquire(); print(sem.get_value())\n")
    (out, _, status), _ = _both([PYTHON, "-c", code], tmp_path)
    assert (out, status) == (b"False\n2\n", 0)


def test_host_tree_is_byte_for_byte_unchanged_after_a_guest_that_writes_everywhere(tmp_path: Path) -> None:
    root = _host_tree(tmp_path / "tree")
    before = tree_digest(root)
    script = ("set -e; echo new > a/new.txt; echo more >> a/one.txt; mv a/sub a/moved; rm gone.txt; "
              "rmdir empty; mkdir made; ln -s made ml; ln a/one.txt hard; chmod 600 a/one.txt; truncate -s 1 hard; "
              "touch -d @0 a/moved/two.txt; mv link link2; find . | sort; cat a/one.txt; stat -c %a a/one.txt")
    emulated = run_emulated([BASH, "-c", script], cwd=root)
    assert emulated.status == 0, emulated.err
    assert b"./a/moved/two.txt" in emulated.out and b"./gone.txt" not in emulated.out
    assert emulated.out.endswith(b"o600\n")
    assert tree_digest(root) == before


def test_read_only_gives_erofs(tmp_path: Path) -> None:
    emulated = run_emulated([BASH, "-c", "echo x > f; echo $?"], cwd=tmp_path, read_only=True)
    assert emulated.observed() == (b"1\n", b"/bin/bash: line 1: f: Read-only file system\n", 0)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "emu", *args], cwd=cwd, capture_output=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_save_writes_copies_what_the_guest_wrote(tmp_path: Path) -> None:
    work, saved = tmp_path / "work", tmp_path / "saved"
    work.mkdir()
    (work / "old").write_text("old")
    proc = _cli("run", "--save-writes", str(saved), BASH, "-c", "mkdir -p a/b; echo hi > a/b/c; rm old; ln -s c a/b/l",
                cwd=work)
    assert proc.returncode == 0, proc.stderr
    mirror = saved / str(work).lstrip("/")
    assert (mirror / "a/b/c").read_text() == "hi\n" and os.readlink(mirror / "a/b/l") == "c"
    assert (saved / ".whiteouts").read_text() == f"{work}/old\n"
    assert sorted(p.name for p in work.iterdir()) == ["old"]
    refused = _cli("run", "--save-writes", str(saved), BASH, "-c", "true", cwd=work)
    assert refused.returncode == 2 and refused.stderr.count(b"\n") == 1 and b"not an empty directory" in refused.stderr


def test_proc_self_cmdline_is_made_when_read_not_when_opened(tmp_path: Path) -> None:
    """bash opens the redirection, then execs tr in the same process: tr reads its own arguments."""
    argv = [BASH, "-c", "tr '\\0' ' ' < /proc/self/cmdline; echo"]
    assert run_emulated(argv, cwd=tmp_path).observed() == run_native(argv, cwd=tmp_path).observed()
    g = GuestKernel(cwd=str(tmp_path))
    fd = g.open("/proc/self/cmdline")
    g.kernel.ident = dataclasses.replace(g.kernel.ident, argv=(b"changed",))  # what execve does
    assert g.read_fd(fd) == b"changed\0"


def test_creat_and_chmod_through_proc_self_fd(tmp_path: Path) -> None:
    """tar extracts with creat() and sets modes through /proc/self/fd/N: the open file itself changes."""
    g = _g(tmp_path)
    fd = g("creat", g.cstr("c"), 0o644)
    assert fd >= 0 and _write(g, fd, b"c") == 1 and g.slurp("c") == b"c"
    assert g("chmod", g.cstr(f"/proc/self/fd/{fd}"), 0o600) == 0
    assert _stat(g, "c")[0] & 0o777 == 0o600  # type: ignore[index]
    assert g("chmod", g.cstr("/proc/self/status"), 0o600) == -errno.EPERM


def test_a_read_only_descriptor_opened_before_the_first_write_sees_the_guests_bytes(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"host bytes")
    g = _g(tmp_path)
    reader = g.open("f")
    assert g.read_fd(reader, 5) == b"host "
    writer = g.open("f", O_RDWR)
    assert g("pwrite64", writer, g.alloc(5, b"GUEST"), 5, 5) == 5
    assert g.read_fd(reader) == b"GUEST"  # the rest, from the offset it had reached
    assert g("lseek", reader, 0, os.SEEK_SET) == 0 and g.read_fd(reader) == b"host GUEST"
    assert _fstat(g, reader)[2] == 10 and (tmp_path / "f").read_bytes() == b"host bytes"
    ro = GuestKernel(cwd=str(tmp_path), read_only=True)  # the negative control: no layer, host bytes only
    assert ro.slurp("f") == b"host bytes"


def test_programs_the_guest_wrote_can_be_executed(tmp_path: Path) -> None:
    script = ("cp /bin/echo e && ./e copied && printf '#!/bin/sh\\necho script\\n' > s && chmod +x s && ./s && "
              "chmod -x s; ./s; echo $?; : > e; ./e; echo $?")
    (out, err, status), _ = _both([BASH, "-c", script], tmp_path)
    assert out == b"copied\nscript\n126\n0\n" and b"./s: Permission denied" in err


def test_fallocate_grows_a_guest_file(tmp_path: Path) -> None:
    g = _g(tmp_path)
    fd = g.open("big", O_RDWR | O_CREAT, 0o600)
    assert g("fallocate", fd, 0, 0, 8192) == 0 and _fstat(g, fd)[2] == 8192
    assert g("fallocate", fd, 1, 0, 1 << 20) == 0 and _fstat(g, fd)[2] == 8192  # FALLOC_FL_KEEP_SIZE
    assert g("fallocate", fd, 2, 0, 10) == -errno.EOPNOTSUPP  # FALLOC_FL_PUNCH_HOLE
    assert g("fallocate", fd, 0, 0, 0) == -errno.EINVAL
    assert g("fallocate", g.open("big"), 0, 0, 10) == -errno.EBADF
